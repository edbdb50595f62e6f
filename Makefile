# Build-time artefacts the Debian package installs (nothing here is needed at run time).
#
#   make completions   bash and zsh completion scripts, generated from the argparse parser by
#                      shtab (Debian: python3-shtab, a build dependency only), into build/completions/
#   make install-completions DESTDIR=debian/hal0-reconciler
#                      bash: /usr/share/bash-completion/completions/hal0-reconciler
#                      zsh:  /usr/share/zsh/vendor-completions/_hal0-reconciler

PYTHON ?= python3
OUT ?= build/completions
SHTAB = PYTHONPATH=src $(PYTHON) -m shtab --prog=hal0-reconciler hal0_reconciler.cli.build_parser

.PHONY: completions install-completions

completions:
	mkdir -p $(OUT)
	$(SHTAB) --shell=bash > $(OUT)/hal0-reconciler.tmp && mv $(OUT)/hal0-reconciler.tmp $(OUT)/hal0-reconciler
	$(SHTAB) --shell=zsh > $(OUT)/_hal0-reconciler.tmp && mv $(OUT)/_hal0-reconciler.tmp $(OUT)/_hal0-reconciler

install-completions: completions
	install -D -m 0644 $(OUT)/hal0-reconciler $(DESTDIR)/usr/share/bash-completion/completions/hal0-reconciler
	install -D -m 0644 $(OUT)/_hal0-reconciler $(DESTDIR)/usr/share/zsh/vendor-completions/_hal0-reconciler
