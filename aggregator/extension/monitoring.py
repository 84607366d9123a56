"""What a shoot's own Prometheus and Alertmanager get of its protection, the Gardener way
(docs/extensions/logging-and-monitoring.md in gardener/gardener): in the shoot's control-plane
namespace, beside the shoot part, a ServiceMonitor and a PrometheusRule labelled
``prometheus: shoot``, which the shoot's Prometheus takes from its own namespace.

The ServiceMonitor scrapes the aggregator's metrics Service in the controller's namespace and
keeps only this shoot's series of the few the rules read; the aggregator's Service lets the
shoot's Prometheus in (its ``from-all-scrape-targets`` annotations, the chart's service.yaml).
The rules fire where protection holds the shoot's controllers down, and where it cannot judge
the shoot at all (no fresh view of its leases): what the shoot's owner and operator are told in
the shoot's own alerts, as against the seed's rules (manifests/monitoring) for the landscape.

Pure: the reconciler (aggregator/extension/reconciler.py) writes these with the shoot part.
"""

from __future__ import annotations

from typing import Any

NAME = "dwd-lease"
SERVICE_MONITORS = "/apis/monitoring.coreos.com/v1/namespaces/{ns}/servicemonitors"
PROMETHEUS_RULES = "/apis/monitoring.coreos.com/v1/namespaces/{ns}/prometheusrules"
# The chart's selector label of the aggregator's Service (templates/_helpers.tpl).
SERVICE_SELECTOR = {"app.kubernetes.io/name": "dwd-lease-aggregator"}
KEPT = ("dwd_target_phase", "dwd_target_leading", "dwd_target_synced", "dwd_target_dry_run")
# Gardener's shoot alerts carry these: who sees them (owner and operator) and of what.
ALERT_LABELS = {"service": "dwd-lease", "type": "shoot", "visibility": "all"}
# Each series counted only from the replica that acts for the shoot: a standby judges too.
LEADING = "and on (instance) (dwd_target_leading == 1)"

RULES: list[dict[str, Any]] = [
    {
        "alert": "DwdLeaseControllersHeldDown",
        "expr": (
            f'count((dwd_target_phase{{phase="scaled-down"}} == 1) {LEADING}'
            " and on (instance) (dwd_target_dry_run == 0)) > 0"
        ),
        "labels": {**ALERT_LABELS, "severity": "warning"},
        "annotations": {
            "summary": "the shoot's kube-controller-manager, machine-controller-manager and "
            "cluster-autoscaler are held at 0",
            "description": (
                "A quorum of the shoot's nodes cannot reach its API server, so dwd-lease scaled "
                "the controllers down: nodes are not marked NotReady nor replaced meanwhile. "
                "They come back by themselves once the nodes reach the API server again."
            ),
        },
    },
    {
        "alert": "DwdLeaseCannotJudge",
        # count, not max: the series kept by == 0 are worth 0.
        "expr": f"count((dwd_target_synced == 0) {LEADING}) > 0",
        "for": "10m",
        "labels": {**ALERT_LABELS, "severity": "warning"},
        "annotations": {
            "summary": "dwd-lease has no fresh view of the shoot's node leases",
            "description": (
                "Without it dwd-lease cannot tell a broken path to the API server from broken "
                "nodes: the shoot is not protected from a meltdown while this lasts."
            ),
        },
    },
]


def service_monitor(namespace: str, controller_namespace: str) -> dict[str, Any]:
    """The shoot Prometheus's scrape of the aggregator, this shoot's series of ``KEPT`` alone."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": {"name": NAME, "namespace": namespace, "labels": {"prometheus": "shoot"}},
        "spec": {
            "namespaceSelector": {"matchNames": [controller_namespace]},
            "selector": {"matchLabels": dict(SERVICE_SELECTOR)},
            "endpoints": [
                {
                    "port": "metrics",
                    "metricRelabelings": [
                        {
                            "sourceLabels": ["__name__"],
                            "action": "keep",
                            "regex": "^(" + "|".join(KEPT) + ")$",
                        },
                        {"sourceLabels": ["target"], "action": "keep", "regex": f"^{namespace}$"},
                    ],
                }
            ],
        },
    }


def prometheus_rule(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": NAME, "namespace": namespace, "labels": {"prometheus": "shoot"}},
        "spec": {"groups": [{"name": "dwd-lease.shoot", "rules": RULES}]},
    }


def paths(namespace: str) -> tuple[str, str]:
    return (
        SERVICE_MONITORS.format(ns=namespace) + "/" + NAME,
        PROMETHEUS_RULES.format(ns=namespace) + "/" + NAME,
    )
