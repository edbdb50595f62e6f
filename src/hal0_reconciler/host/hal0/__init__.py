"""The installed hal0 release: where it is, which release it is, and the facts each release
judges slots by (one module per fact source; :mod:`.reader` puts them together)."""
