"""Operator settings (server/config.py): GATEWAY_* variables, flags over variables, and a
wrong value refused with a message naming the variable (in-process; test_cli.py runs
`gateway up` with bad values)."""

from __future__ import annotations

from pathlib import Path

import pytest

from server.config import SettingsError, load_settings


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("GATEWAY_"):
            monkeypatch.delenv(name)


def test_defaults(tmp_path: Path) -> None:
    settings = load_settings(tmp_path)
    assert settings.database_url == f"sqlite+aiosqlite:///{(tmp_path / 'gateway.db').resolve()}"
    assert (settings.grpc_port, settings.metrics_port, settings.decode_workers) == (50051, 0, 2)
    assert settings.edge.any_origin and settings.edge.client_requests_per_second == 300


def test_variables_are_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {
        "GATEWAY_DATA_DIR": str(tmp_path),
        "GATEWAY_DATABASE_URL": "postgres://u@h/db",
        "GATEWAY_CATALOG": "/etc/catalog.toml",
        "GATEWAY_REGIONAL_HOSTS": "EU.example.com., ,b.example",
        "GATEWAY_WEBHOOK_ALLOW_PRIVATE": "1",
        "GATEWAY_PROVIDER_DOWNLOADS_ALLOW_PRIVATE": "1",
        "GATEWAY_JOB_LEASE_SECONDS": "5.5",
        "GATEWAY_LOCAL_STT_QUEUE": "0",
        "GATEWAY_METRICS_PORT": "",  # empty: the default
        "GATEWAY_CORS_ORIGINS": "https://a.example, http://b.example:8080",
        "GATEWAY_EDGE_MAX_CONNECTIONS": "7",
    }.items():
        monkeypatch.setenv(name, value)
    settings = load_settings()
    assert settings.data_dir == tmp_path
    assert settings.database_url == "postgresql+asyncpg://u@h/db"
    assert settings.catalog_file == "/etc/catalog.toml"
    assert settings.regional_hosts == frozenset({"eu.example.com", "b.example"})
    assert settings.webhook_allow_private and settings.job_lease_seconds == 5.5
    assert settings.provider_downloads_allow_private
    assert settings.local_stt_queue == 0 and settings.metrics_port == 0
    assert settings.edge.cors_origins == ("https://a.example", "http://b.example:8080")
    assert settings.edge.max_connections == 7 and not settings.edge.any_origin


def test_flags_win_over_variables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_METRICS_PORT", "9100")
    monkeypatch.setenv("GATEWAY_CATALOG", "/env.toml")
    settings = load_settings(tmp_path, "sqlite:////tmp/x.db", metrics_port=9200, catalog_file=None)
    assert settings.metrics_port == 9200 and settings.catalog_file == "/env.toml"
    assert settings.database_url == "sqlite+aiosqlite:////tmp/x.db"


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("GATEWAY_JOB_LEASE_SECONDS", "soon", "GATEWAY_JOB_LEASE_SECONDS must be a number"),
        ("GATEWAY_JOB_LEASE_SECONDS", "nan", "GATEWAY_JOB_LEASE_SECONDS"),
        ("GATEWAY_DECODE_WORKERS", "0", "GATEWAY_DECODE_WORKERS must be greater than or equal"),
        ("GATEWAY_METRICS_PORT", "70000", "GATEWAY_METRICS_PORT must be less than or equal"),
        ("GATEWAY_WEBHOOK_ALLOW_PRIVATE", "perhaps", "GATEWAY_WEBHOOK_ALLOW_PRIVATE must be 1"),
        ("GATEWAY_EDGE_CLIENT_RPS", "lots", "GATEWAY_EDGE_CLIENT_RPS must be a number"),
        ("GATEWAY_EDGE_IDLE_TIMEOUT_SECONDS", "-1", "must be greater than 0"),
        ("GATEWAY_CORS_ORIGINS", "ftp://x", "GATEWAY_CORS_ORIGINS: 'ftp://x' is not an origin"),
    ],
)
def test_wrong_values_name_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variable: str, value: str, message: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(SettingsError) as caught:
        load_settings(tmp_path)
    assert message in str(caught.value)


def test_a_wrong_flag_names_the_flag(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="--metrics-port"):
        load_settings(tmp_path, metrics_port=-1)


def test_a_workspaces_video_share_leaves_slots_to_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = load_settings(tmp_path)
    assert (settings.video_jobs_at_once, settings.video_workspace_jobs_at_once) == (8, 6)
    monkeypatch.setenv("GATEWAY_VIDEO_JOBS_AT_ONCE", "3")
    monkeypatch.setenv("GATEWAY_VIDEO_WORKSPACE_JOBS_AT_ONCE", "2")
    settings = load_settings(tmp_path)
    assert (settings.video_jobs_at_once, settings.video_workspace_jobs_at_once) == (3, 2)
    monkeypatch.setenv("GATEWAY_VIDEO_WORKSPACE_JOBS_AT_ONCE", "3")
    with pytest.raises(SettingsError) as caught:
        load_settings(tmp_path)
    assert "GATEWAY_VIDEO_WORKSPACE_JOBS_AT_ONCE (3) must be below" in str(caught.value)
    assert "GATEWAY_VIDEO_JOBS_AT_ONCE (3)" in str(caught.value)


def test_webhook_bounds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every webhook attempt's bounds have a default, are read from their variables, and
    a workspace's share must leave slots to the others (else one slow receiver could hold
    every delivery of a process again)."""
    settings = load_settings(tmp_path)
    assert settings.webhook_deadline_seconds == 10.0
    assert (settings.webhook_concurrency, settings.webhook_workspace_concurrency) == (16, 4)
    assert settings.webhook_max_answer_bytes == 16 * 1024
    monkeypatch.setenv("GATEWAY_WEBHOOK_DEADLINE_SECONDS", "2.5")
    monkeypatch.setenv("GATEWAY_WEBHOOK_CONCURRENCY", "3")
    monkeypatch.setenv("GATEWAY_WEBHOOK_WORKSPACE_CONCURRENCY", "2")
    monkeypatch.setenv("GATEWAY_WEBHOOK_MAX_ANSWER_BYTES", "0")
    settings = load_settings(tmp_path)
    assert settings.webhook_deadline_seconds == 2.5 and settings.webhook_max_answer_bytes == 0
    assert (settings.webhook_concurrency, settings.webhook_workspace_concurrency) == (3, 2)
    monkeypatch.setenv("GATEWAY_WEBHOOK_WORKSPACE_CONCURRENCY", "3")
    with pytest.raises(SettingsError) as caught:
        load_settings(tmp_path)
    assert "GATEWAY_WEBHOOK_WORKSPACE_CONCURRENCY (3) must be below" in str(caught.value)
    assert "GATEWAY_WEBHOOK_CONCURRENCY (3)" in str(caught.value)
    monkeypatch.setenv("GATEWAY_WEBHOOK_DEADLINE_SECONDS", "soon")
    with pytest.raises(SettingsError, match="GATEWAY_WEBHOOK_DEADLINE_SECONDS must be a number"):
        load_settings(tmp_path)


def test_a_workspaces_body_share_is_at_most_the_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert load_settings(tmp_path).body_budget_workspace_bytes is None  # derived (body.py)
    monkeypatch.setenv("GATEWAY_BODY_BUDGET_BYTES", "1000")
    monkeypatch.setenv("GATEWAY_BODY_BUDGET_WORKSPACE_BYTES", "600")
    assert load_settings(tmp_path).body_budget_workspace_bytes == 600
    monkeypatch.setenv("GATEWAY_BODY_BUDGET_WORKSPACE_BYTES", "1001")
    with pytest.raises(SettingsError) as caught:
        load_settings(tmp_path)
    assert "GATEWAY_BODY_BUDGET_WORKSPACE_BYTES (1001) must not be above" in str(caught.value)
