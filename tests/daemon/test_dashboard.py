"""The Grafana dashboard beside the alert rules: valid dashboard JSON whose every query names
metrics a running daemon really writes (or node_exporter's textfile mtime), and a textfile
rewritten after every full pass, so its mtime tells a live daemon from a stopped one."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from daemon.test_alert_rules import _samples, _written_by_a_daemon
from helpers.daemon_host import Host, running, wait_until
from helpers.hosts import REPO

DASHBOARD = REPO / "packaging/grafana/hal0-reconciler.dashboard.json"
NODE_EXPORTER = {"node_textfile_mtime_seconds"}  # node_exporter's own, about our file
_METRIC = re.compile(r"\b((?:hal0_reconciler|node_textfile)_[a-z_]+)\b")


def dashboard() -> dict[str, Any]:
    doc = json.loads(DASHBOARD.read_text())
    assert isinstance(doc, dict)
    return doc


def queries() -> list[str]:
    return [t["expr"] for p in dashboard()["panels"] for t in p["targets"]]


def test_the_dashboard_is_an_importable_grafana_dashboard() -> None:
    """A title and uid, a schema version, a Prometheus data-source variable, and panels with
    unique ids, a place on the grid and at least one query each, all on that data source."""
    doc = dashboard()
    assert ("hal0-reconciler", "hal0-reconciler") == (doc["title"], doc["uid"])
    assert isinstance(doc["schemaVersion"], int)
    variables = {v["name"]: v for v in doc["templating"]["list"]}
    assert ("datasource", "prometheus") == (
        variables["datasource"]["type"],
        variables["datasource"]["query"],
    )
    panels = doc["panels"]
    assert len(panels) == len({p["id"] for p in panels})
    for panel in panels:
        assert {"x", "y", "w", "h"} <= set(panel["gridPos"]), panel["title"]
        assert panel["targets"], panel["title"]
        assert "${datasource}" == panel["datasource"]["uid"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]


def test_every_query_names_a_metric_a_running_daemon_writes(
    host: Host, notify_socket: Any, tmp_path: Path
) -> None:
    """Each hal0_reconciler_* name in a query, and each label it matches on, is in the textfile
    of a running daemon (with an aiter tree): a renamed metric would show an empty panel."""
    samples = _samples(_written_by_a_daemon(host, notify_socket, tmp_path))
    written = {name for name, _, _ in samples}
    named = {n for q in queries() for n in _METRIC.findall(q)}
    assert set() == named - written - NODE_EXPORTER
    labels = {(name, label) for name, label, _ in samples if label}
    for query in queries():
        for name, matchers in re.findall(r"(hal0_reconciler_[a-z_]+)\{([^}]*)\}", query):
            for label in re.findall(r"(\w+)=~?\"", matchers):
                assert label == "instance" or (name, label) in labels, query


def test_the_dashboard_shows_every_part_of_the_job() -> None:
    """Lane state, relabels, demotions and restores, restarts by result, fights, health, aiter,
    and the metrics file's age."""
    named = {n for q in queries() for n in _METRIC.findall(q)}
    for family in (
        "hal0_reconciler_rocm_lane",
        "hal0_reconciler_relabels_total",
        "hal0_reconciler_demotions_total",
        "hal0_reconciler_restores_total",
        "hal0_reconciler_restarts_total",
        "hal0_reconciler_fights_total",
        "hal0_reconciler_healthy",
        "hal0_reconciler_aiter_modules_uncovered",
        "hal0_reconciler_aiter_modules_not_converging",
        "node_textfile_mtime_seconds",
    ):
        assert family in named


def test_a_quiet_daemon_rewrites_its_textfile_after_every_full_pass(
    host: Host, notify_socket: Any, tmp_path: Path
) -> None:
    """Nothing changes, yet each full pass (every resync_interval) rewrites the file: its
    mtime, what the staleness alert reads, keeps moving while the daemon runs."""
    metrics_file = tmp_path / "textfile/hal0_reconciler.prom"
    metrics_file.parent.mkdir()
    settings = host.settings(metrics_textfile=str(metrics_file), resync_interval=0.5)
    with running(settings):
        notify_socket.wait_for("READY=1")
        wait_until(metrics_file.exists, what="the first textfile")
        first = os.stat(metrics_file).st_mtime_ns
        wait_until(lambda: os.stat(metrics_file).st_mtime_ns != first, what="a rewrite")
        second = os.stat(metrics_file).st_mtime_ns
        wait_until(lambda: os.stat(metrics_file).st_mtime_ns != second, what="another")
    passes = _samples(metrics_file.read_text())[("hal0_reconciler_passes_total", "", "")]
    assert passes >= 3
