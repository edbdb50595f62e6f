"""The command line's exit codes: the constants every verb returns, and each verb's table,
printed at the end of its ``--help`` (and checked against the man page)."""

from __future__ import annotations

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_PENDING = 2
EXIT_UNJUDGED = 3  # a slot file could not be judged (once, plan): distinct from "pending"
EXIT_CONFIG = 78  # sysexits.h EX_CONFIG: the settings file is invalid (RestartPreventExitStatus=)
_CONFIG_EXIT = (EXIT_CONFIG, "the settings file is invalid (the error names the file and the key)")
JSON_SCHEMA = 3  # of plan/once/probe/status --json, bumped by a change that breaks a reader
# (3: hal0 by release: "release" and "summary", era values, no "runners" axis)
# (2: one name per lane state, the metrics' own: "not-amd" where 1 said null or "unusable")

# Each verb's exit codes, printed at the end of its --help.
EXITS: dict[str, tuple[tuple[int, str], ...]] = {
    "once": (
        (0, "every slot judged, every change written"),
        (
            1,
            (
                "error: settings or usage, slots folder missing, a write failed, the probe "
                "could not run as the service user"
            ),
        ),
        (
            3,
            (
                "a slot file could not be judged (not TOML, not UTF-8, not a regular file, "
                "runtime unresolved)"
            ),
        ),
        _CONFIG_EXIT,
    ),
    "plan": (
        (0, "nothing pending"),
        (1, "error: settings or usage, slots folder missing"),
        (2, "changes pending"),
        (3, "a slot file could not be judged (takes precedence over 2)"),
        _CONFIG_EXIT,
    ),
    "probe": (
        (0, "the ROCm lane is usable by the service user"),
        (1, "not usable, not an AMD host, or error"),
        _CONFIG_EXIT,
    ),
    "run": (
        (0, "stopped (SIGTERM, SIGINT)"),
        (1, "could not start"),
        _CONFIG_EXIT,
        (75, "/etc/hal0 was re-created: systemd restarts the daemon to see it (EX_TEMPFAIL)"),
    ),
    "check-config": (
        (0, "the settings file is valid (or absent: the defaults apply)"),
        (1, "usage error (a bad --set value)"),
        _CONFIG_EXIT,
    ),
    "status": (
        (0, "running and healthy"),
        (1, "running but degraded or unhealthy, or its status is stale"),
        (3, "not running"),
        (4, "status unknown (the status file cannot be read)"),
    ),
    "reload": (
        (0, "the new settings are live (their first full pass is done)"),
        (1, "refused: the daemon keeps its old settings (the journal says why); or no answer"),
        (3, "not running, or it exited during the reload"),
        (EXIT_CONFIG, "refused: the settings file on disk is invalid (the old settings stay)"),
    ),
    "aiter plan": (
        (0, "nothing to do"),
        (1, "error, or a module whose heal cannot converge"),
        (2, "a heal is pending"),
    ),
    "aiter heal": ((0, "healed or nothing to do"), (1, "error"), (2, "refused: a build runs")),
    "aiter restore": ((0, "restored"), (1, "error")),
    "aiter explain": ((0, "explained"), (1, "not found in any table, or error")),
}
