"""deploy/: Prometheus and Grafana in the compose file, and the files they are provisioned from,
checked by reading them (test_prometheus.py runs a real Prometheus against the services):
- the dashboard (grafana/dashboards/gavel.json) against a JSON Schema of what Grafana needs of it
  (written here: jsonschema is not a dependency), with every panel on the provisioned data source,
  panels inside the 24-column grid and not overlapping, and every metric it reads in
  docs/metrics.md's catalog;
- the provisioning files (a Prometheus data source with a fixed uid; a file provider whose path is
  where compose mounts the dashboards);
- prometheus/prometheus.yml: accepted by promtool (Debian's package, as test_prometheus.py's
  server); every gavel service scraped on the metrics port its compose command
  gives, the scaled and profile services through Docker's DNS, a scrape interval shorter than a round;
- the compose services: pinned official images, ports published on loopback only, provisioning
  mounted read-only, unprivileged users, Grafana's password from .env and seen by Grafana alone;
- docs/deploy.md names every panel and where to open both.
"""

from __future__ import annotations

import copy
import re
import subprocess
from typing import Any

import pytest
import yaml

from tests.deploy.test_compose import (
    LONG_RUNNING,
    PASSWORD_VARS,
    compose,
    env_example,
    gavel_argv,
    interpolate,
    parse_gavel,
    referenced_variables,
    seconds,
    service,
)
from tests.support.prometheus import (
    DASHBOARD_PROVIDERS,
    PROMETHEUS_CONFIG,
    SYNTHETIC,
    catalog,
    catalog_series_names,
    dashboard,
    dashboard_queries,
    datasources,
    metric_names,
    prometheus_binary,
    provisioned_uid,
)

MONITORING = ("prometheus", "grafana")
SCALED = ("policy", "worker")  # `--scale N`: replicas found through Docker's DNS
PROFILES = ("fleet", "worker")  # not always running: a target only while they are

# -- a JSON Schema, and the subset of its validation the schema below uses -------------------------

PANEL_TYPES = [
    "timeseries", "heatmap", "stat", "gauge", "bargauge", "table", "text", "row", "piechart", "histogram",
    "state-timeline", "status-history", "barchart",
]  # fmt: skip

DATASOURCE_REF = {
    "type": "object",
    "required": ["type", "uid"],
    "properties": {"type": {"const": "prometheus"}, "uid": {"const": "<provisioned>"}},
}

DASHBOARD_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["uid", "title", "schemaVersion", "panels", "time"],
    "properties": {
        "uid": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,40}$"},
        "title": {"type": "string", "minLength": 1},
        "schemaVersion": {"type": "integer", "minimum": 36},
        "editable": {"type": "boolean"},
        "time": {"type": "object", "required": ["from", "to"]},
        "templating": {"type": "object", "required": ["list"], "properties": {"list": {"type": "array"}}},
        "panels": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["id", "type", "title", "gridPos", "datasource", "targets"],
                "properties": {
                    "id": {"type": "integer", "minimum": 1},
                    "type": {"enum": PANEL_TYPES},
                    "title": {"type": "string", "minLength": 1},
                    "description": {"type": "string"},
                    "gridPos": {
                        "type": "object",
                        "required": ["x", "y", "w", "h"],
                        "properties": {
                            "x": {"type": "integer", "minimum": 0, "maximum": 23},
                            "y": {"type": "integer", "minimum": 0},
                            "w": {"type": "integer", "minimum": 1, "maximum": 24},
                            "h": {"type": "integer", "minimum": 1},
                        },
                    },
                    "datasource": DATASOURCE_REF,
                    "targets": {
                        "type": "array",
                        "minItems": 1,
                        "items": {
                            "type": "object",
                            "required": ["refId", "expr", "datasource"],
                            "properties": {
                                "refId": {"type": "string", "pattern": "^[A-Z]$"},
                                "expr": {"type": "string", "minLength": 1},
                                "legendFormat": {"type": "string"},
                                "format": {"enum": ["time_series", "table", "heatmap"]},
                                "datasource": DATASOURCE_REF,
                            },
                        },
                    },
                },
            },
        },
    },
}

_TYPES = {
    "object": dict, "array": list, "string": str, "boolean": bool, "number": (int, float), "integer": int,
}  # fmt: skip


def schema_errors(value: Any, schema: dict[str, Any], where: str = "$") -> list[str]:
    """What ``value`` breaks of ``schema`` (JSON Schema's type, required, properties, items, enum,
    const, minItems, minimum, maximum, minLength, pattern): one line each, with its JSON path."""
    errors = []
    kind = schema.get("type")
    if kind and (not isinstance(value, _TYPES[kind]) or (kind in ("integer", "number") and isinstance(value, bool))):
        return [f"{where}: {type(value).__name__}, not {kind}"]
    if "const" in schema and value != schema["const"]:
        errors.append(f"{where}: {value!r}, not {schema['const']!r}")
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{where}: {value!r} is none of {schema['enum']}")
    if "minimum" in schema and value < schema["minimum"]:
        errors.append(f"{where}: {value} < {schema['minimum']}")
    if "maximum" in schema and value > schema["maximum"]:
        errors.append(f"{where}: {value} > {schema['maximum']}")
    if "minLength" in schema and len(value) < schema["minLength"]:
        errors.append(f"{where}: shorter than {schema['minLength']}")
    if "pattern" in schema and not re.search(schema["pattern"], value):
        errors.append(f"{where}: {value!r} does not match {schema['pattern']}")
    if isinstance(value, dict):
        errors += [f"{where}: no {key!r}" for key in schema.get("required", ()) if key not in value]
        for key, sub in schema.get("properties", {}).items():
            if key in value:
                errors += schema_errors(value[key], sub, f"{where}.{key}")
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            errors.append(f"{where}: fewer than {schema['minItems']} items")
        if "items" in schema:
            for i, item in enumerate(value):
                errors += schema_errors(item, schema["items"], f"{where}[{i}]")
    return errors


def the_schema() -> dict[str, Any]:
    """DASHBOARD_SCHEMA with the provisioned data source's uid in place of <provisioned>."""
    text = yaml.safe_dump(DASHBOARD_SCHEMA).replace("<provisioned>", provisioned_uid())
    return yaml.safe_load(text)


def panels() -> list[dict[str, Any]]:
    return dashboard()["panels"]


# -- the dashboard --------------------------------------------------------------------------------


def test_the_dashboard_is_what_grafana_reads() -> None:
    assert schema_errors(dashboard(), the_schema()) == []


@pytest.mark.parametrize(
    "break_it",
    [
        lambda d: d.pop("uid"),
        lambda d: d["panels"][0].update(type="grahp"),
        lambda d: d["panels"][0]["datasource"].update(uid="another"),
        lambda d: d["panels"][-1]["targets"][0]["datasource"].update(uid="another"),
        lambda d: d["panels"][1]["targets"][0].pop("expr"),
        lambda d: d["panels"][2]["gridPos"].update(w=25),
        lambda d: d.update(schemaVersion="39"),
    ],
    ids=["no uid", "unknown panel type", "panel data source", "query data source", "no expr", "too wide", "string version"],
)
def test_the_schema_check_refuses_a_broken_dashboard(break_it: Any) -> None:
    broken = copy.deepcopy(dashboard())
    break_it(broken)
    assert schema_errors(broken, the_schema())


def test_panels_have_unique_ids_and_refids_and_fit_the_grid_without_overlapping() -> None:
    ids = [p["id"] for p in panels()]
    assert len(ids) == len(set(ids))
    for p in panels():
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
    boxes = [(p["title"], p["gridPos"]) for p in panels()]
    for title, g in boxes:
        assert g["x"] + g["w"] <= 24, title
    for i, (a, ga) in enumerate(boxes):
        for b, gb in boxes[i + 1 :]:
            apart = (ga["x"] + ga["w"] <= gb["x"] or gb["x"] + gb["w"] <= ga["x"]
                     or ga["y"] + ga["h"] <= gb["y"] or gb["y"] + gb["h"] <= ga["y"])  # fmt: skip
            assert apart, f"{a!r} and {b!r} overlap"


def test_the_dashboard_shows_what_the_issue_asks_for() -> None:
    """GPUs in use per type, pending jobs by reason, the JCT distribution, queue length, solve
    time, allocation against attained share, worker losses: a panel reads each."""
    read: dict[str, set[str]] = {}
    for title, _, expr in dashboard_queries():
        read.setdefault(title, set()).update(metric_names(expr))
    wanted = {
        "gavel_mechanism_gpus", "gavel_mechanism_jobs_pending", "gavel_mechanism_job_completion_seconds_bucket",
        "gavel_queue_messages", "gavel_policy_solve_duration_seconds_bucket", "gavel_mechanism_allocated_gpus",
        "gavel_mechanism_worker_losses_total",
    }  # fmt: skip
    assert wanted <= set().union(*read.values())
    allocation = next(names for title, names in read.items() if "gavel_mechanism_allocated_gpus" in names)
    assert "gavel_mechanism_gpus" in allocation, "allocated and busy GPUs in one panel"


def test_every_metric_the_dashboard_reads_is_in_the_catalog() -> None:
    """docs/metrics.md is the contract: a name outside it (a typo, a metric renamed) fails here,
    before test_prometheus.py runs the services."""
    unknown = {
        (title, ref, name)
        for title, ref, expr in dashboard_queries()
        for name in metric_names(expr)
        if name not in catalog_series_names() | SYNTHETIC
    }
    assert not unknown, sorted(unknown)


def test_only_counters_are_taken_a_rate_of_and_only_histograms_a_quantile_of() -> None:
    """rate() and increase() of a gauge, or histogram_quantile() of anything but buckets, answer
    numbers that mean nothing; Prometheus evaluates them all the same, so only this catches it."""
    kinds = catalog()
    for title, ref, expr in dashboard_queries():
        for name in re.findall(r"\b(?:rate|irate|increase)\(\s*([A-Za-z_:][A-Za-z0-9_:]*)", expr):
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            assert kinds.get(name) == "counter" or (kinds.get(base) == "histogram" and base != name), (title, ref, name)
        if "histogram_quantile" in expr:
            assert all(name.endswith("_bucket") for name in metric_names(expr)), (title, ref, expr)


def test_metric_names_are_read_from_promql() -> None:
    expr = (
        'histogram_quantile(0.9, sum by (le, policy) (rate(a_seconds_bucket{x="y(z)"}[$__rate_interval])))'
        " / on (policy) group_left sum without (le) (b_total offset 5m) + max(c:recorded) > bool 2e3 and up"
    )
    assert metric_names(expr) == {"a_seconds_bucket", "b_total", "c:recorded", "up"}


# -- provisioning ---------------------------------------------------------------------------------


def mounts(name: str) -> dict[str, tuple[str, list[str]]]:
    """The service's volumes: target -> (source, options)."""
    found = {}
    for m in service(name)["volumes"]:
        source, target, *options = interpolate(m, env_example()).split(":")
        found[target] = (source, options[0].split(",") if options else [])
    return found


def test_the_data_source_is_prometheus_on_the_compose_network() -> None:
    d = datasources()
    assert d["apiVersion"] == 1
    (source,) = d["datasources"]
    assert source["type"] == "prometheus" and source["access"] == "proxy"
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,40}", source["uid"])
    assert source["url"] == "http://prometheus:9090", "the compose service and its port"
    assert source.get("editable") is False, "the provisioned file, not the UI, says what it is"
    # $__rate_interval is built on it: the scrape interval Prometheus uses
    assert seconds(source["jsonData"]["timeInterval"]) == seconds(prometheus_config()["global"]["scrape_interval"])


def test_grafana_loads_the_dashboards_from_where_compose_mounts_them() -> None:
    d = yaml.safe_load(DASHBOARD_PROVIDERS.read_text())
    assert d["apiVersion"] == 1
    (provider,) = d["providers"]
    assert provider["type"] == "file"
    assert provider.get("allowUiUpdates") is False
    grafana = mounts("grafana")
    assert grafana[provider["options"]["path"]][0] == "./grafana/dashboards"
    assert grafana["/etc/grafana/provisioning"][0] == "./grafana/provisioning"
    home = service("grafana")["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{provider['options']['path']}/gavel.json"


# -- prometheus.yml -------------------------------------------------------------------------------


def prometheus_config() -> dict[str, Any]:
    return yaml.safe_load(PROMETHEUS_CONFIG.read_text())


def scraped() -> dict[str, list[tuple[str, int, str]]]:
    """Compose service -> how Prometheus finds it: (host name, port, "static" or "dns-A")."""
    found: dict[str, list[tuple[str, int, str]]] = {}
    for job in prometheus_config()["scrape_configs"]:
        for static in job.get("static_configs", []):
            for target in static["targets"]:
                host, port = target.rsplit(":", 1)
                found.setdefault(host, []).append((host, int(port), "static"))
        for dns in job.get("dns_sd_configs", []):
            for name in dns["names"]:
                found.setdefault(name, []).append((name, int(dns["port"]), f"dns-{dns['type']}"))
    return found


@pytest.mark.parametrize("name", LONG_RUNNING)
def test_prometheus_scrapes_each_service_on_the_port_its_command_serves(name: str) -> None:
    (target,) = scraped()[name]
    args = parse_gavel(gavel_argv(name))
    assert args.metrics_port == target[1], f"{name}: scraped on {target[1]}, serves on {args.metrics_port}"
    # Prometheus is another container: the service must listen beyond its own loopback
    assert args.metrics_host == "0.0.0.0", name
    assert "ports" not in service(name), f"{name}: its metrics stay on the compose network"
    expected = "dns-A" if name in SCALED or name in PROFILES else "static"
    assert target[2] == expected, f"{name}: {target[2]}"


def test_prometheus_itself_accepts_the_config() -> None:
    """promtool, from the package test_prometheus.py runs, checks it as Prometheus will load it
    (the DNS names resolve only on the compose network: a check of the file, not of the targets)."""
    done = subprocess.run(
        [prometheus_binary("promtool"), "check", "config", str(PROMETHEUS_CONFIG)], capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_prometheus_scrapes_nothing_else_and_more_often_than_a_round() -> None:
    assert set(scraped()) == set(LONG_RUNNING)
    mechanism = parse_gavel(gavel_argv("mechanism"))
    round_wall_s = mechanism.round_s / mechanism.time_scale
    assert seconds(prometheus_config()["global"]["scrape_interval"]) < round_wall_s
    assert mounts("prometheus")["/etc/prometheus/prometheus.yml"][0] == "./prometheus/prometheus.yml"
    flags = [interpolate(a, env_example()) for a in service("prometheus")["command"]]
    assert "--config.file=/etc/prometheus/prometheus.yml" in flags


# -- the compose services -------------------------------------------------------------------------


@pytest.mark.parametrize("name", MONITORING)
def test_monitoring_runs_a_pinned_official_image(name: str) -> None:
    image = interpolate(service(name)["image"], env_example())
    repository, _, tag = image.rpartition(":")
    assert repository in ("prom/prometheus", "grafana/grafana"), image
    assert re.fullmatch(r"v?\d+\.\d+\.\d+", tag), f"{name}: pin a version, not {tag!r}"
    assert "build" not in service(name)


def test_every_published_port_is_on_loopback() -> None:
    """With .env.example's settings nothing is reachable from another host: Prometheus has no
    authentication at all, the broker and Grafana only passwords."""
    published = []
    for name, s in compose()["services"].items():
        for port in s.get("ports", []):
            value = interpolate(str(port), env_example())
            published.append(name)
            assert value.startswith("127.0.0.1:") and value.count(":") == 2, f"{name}: {value}"
    assert {"prometheus", "grafana", "rabbitmq"} <= set(published)
    assert "127.0.0.1:9090:9090" in service("prometheus")["ports"]
    assert "127.0.0.1:3000:3000" in service("grafana")["ports"]


@pytest.mark.parametrize("name", MONITORING)
def test_monitoring_mounts_its_files_read_only_keeps_its_data_and_runs_unprivileged(name: str) -> None:
    for target, (source, options) in mounts(name).items():
        if source.startswith("./"):
            assert "ro" in options, f"{name}: {source} -> {target} is writable"
        else:
            assert source in compose()["volumes"], f"{name}: {source} is not a named volume"
    user = str(service(name)["user"]).split(":")[0]
    assert user.isdigit() and int(user) != 0, f"{name} runs as {user}"
    assert service(name)["cap_drop"] == ["ALL"]
    assert service(name)["restart"] == "unless-stopped"
    assert service(name)["healthcheck"]["test"][0] == "CMD"


def test_grafana_takes_its_password_from_env_and_nobody_else_sees_it() -> None:
    env = service("grafana")["environment"]
    assert referenced_variables(str(env["GF_SECURITY_ADMIN_PASSWORD"])) == {"GRAFANA_ADMIN_PASSWORD"}
    assert env_example()["GRAFANA_ADMIN_PASSWORD"].startswith("change-me")
    assert interpolate(str(env["GF_AUTH_ANONYMOUS_ENABLED"]), env_example()) == "false", "anonymous viewers: off by default"
    assert env["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"
    for name, s in compose()["services"].items():
        seen = referenced_variables(yaml.safe_dump(s))
        if name != "grafana":
            assert "GRAFANA_ADMIN_PASSWORD" not in seen, name
    for name in MONITORING:
        assert not referenced_variables(yaml.safe_dump(service(name))) & set(PASSWORD_VARS.values()), name


# -- the guide ------------------------------------------------------------------------------------


def test_the_deploy_guide_shows_where_to_look_and_every_panel() -> None:
    from tests.deploy.test_compose import DEPLOY_DOC as doc

    text = doc.read_text()
    assert "## Watching the cluster" in text or "### Watching the cluster" in text
    for where in ("http://127.0.0.1:3000", "127.0.0.1:9090", "--metrics-port"):
        assert where in text, where
    missing = [p["title"] for p in panels() if f"**{p['title']}**" not in text]
    assert not missing, f"docs/deploy.md, Watching the cluster, does not describe {missing}"
