"""The web console (/console/) in a real browser — Debian's chromium driven by Playwright,
never a downloaded browser — against the real stack (`gateway up` of this module's own), plus
the REST routes it reads (/activity, /generations, /videos, /videos/{id}/webhooks) end to end.

Screenshots of every page at desktop (1366x900) and phone (390x844) width are written to
test-artifacts/console/ (gitignored; GATEWAY_CONSOLE_ARTIFACTS names another folder, which
.ci/run uses to bring them back from its isolated clone). The browser waits on elements, never
on time."""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
from openrouter import OpenRouter
from playwright.async_api import Browser, Locator, Page, async_playwright, expect

from server.db.models import Workspace
from testkit.admin import Admin, IssuedKey
from testkit.audio import fixture
from testkit.eventually import eventually
from testkit.fakes.openai_stt import FakeSttProvider
from testkit.fakes.webhook_receiver import WebhookReceiver
from tests.conftest import Databases, own_gateway

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(
    os.environ.get("GATEWAY_CONSOLE_ARTIFACTS")
    or Path(__file__).resolve().parent.parent / "test-artifacts" / "console"
)
DESKTOP = {"width": 1366, "height": 900}
PHONE = {"width": 390, "height": 844}
PAGES = ("", "keys", "credits", "activity", "videos", "vault", "guardrails", "byok")


@dataclass
class Console:
    origin: str  # http://127.0.0.1:PORT
    admin: Admin
    workspace: Workspace
    management: IssuedKey
    standard: IssuedKey
    webhooks: WebhookReceiver
    operator_key: str  # what `gateway up` wrote to <data dir>/operator-key

    @property
    def url(self) -> str:
        return f"{self.origin}/console/"

    @property
    def api(self) -> str:
        return f"{self.origin}/api/v1"


@pytest_asyncio.fixture(scope="module")
async def console(
    databases: Databases,
    tmp_path_factory: pytest.TempPathFactory,
    fake_stt: FakeSttProvider,
    webhook_receiver: WebhookReceiver,
) -> AsyncIterator[Console]:
    folder = tmp_path_factory.mktemp("console")
    async with own_gateway(databases, "sqlite", folder, fake_stt, webhook_receiver) as own:
        workspace = await own.admin.workspace("console", intern_programme=True)
        await own.admin.credits(workspace, "10")
        management = await own.admin.key(workspace, "console admin", management=True)
        standard = await own.admin.key(workspace, "console reader")
        await own.admin.intern(workspace, "ada")
        origin = f"http://127.0.0.1:{own.port}"
        operator_key = (own.gateway.data_dir / "operator-key").read_text().strip()
        yield Console(
            origin, own.admin, workspace, management, standard, webhook_receiver, operator_key
        )


@pytest_asyncio.fixture(scope="module")
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=CHROMIUM)
        yield launched
        await launched.close()


async def signed_in(
    browser: Browser,
    console: Console,
    key: str,
    first_page: str = "Usage",
    viewport: dict[str, int] = DESKTOP,
) -> Page:
    context = await browser.new_context(viewport=viewport)
    page = await context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on(
        "console",
        lambda message: errors.append(message.text) if message.type == "error" else None,
    )
    page.errors = errors  # type: ignore[attr-defined]
    await page.goto(console.url)
    await page.get_by_label("API key").fill(key)
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.get_by_role("heading", name=first_page, level=1)).to_be_visible()
    return page


def nav(page: Page, name: str) -> Locator:
    return page.get_by_role("navigation", name="Console pages").get_by_role(
        "link", name=name, exact=True
    )


async def screenshots(page: Page, name: str) -> None:
    await asyncio.to_thread(ARTIFACTS.mkdir, parents=True, exist_ok=True)
    for label, size in (("desktop", DESKTOP), ("phone", PHONE)):
        await page.set_viewport_size(size)
        await page.screenshot(path=ARTIFACTS / f"{name}-{label}.png", full_page=True)
    await page.set_viewport_size(DESKTOP)


async def transcribe(console: Console, key: str) -> str:
    async with httpx.AsyncClient(timeout=60) as client:
        answer = await client.post(
            f"{console.api}/audio/transcriptions",
            headers={"Authorization": f"Bearer {key}"},
            files={"file": ("door.wav", fixture("door"), "audio/wav")},
            data={"model": "local/pocketsphinx-en"},
        )
    assert answer.status_code == 200, answer.text
    return answer.headers["x-generation-id"]


async def test_assets_have_their_type_caching_and_policy_and_nothing_else_is_served(
    console: Console,
) -> None:
    async with httpx.AsyncClient(base_url=console.origin) as client:
        page = await client.get("/console/")
        script = await client.get("/console/vendor/preact-10.29.8.js")
        styles = await client.get("/console/app.css")
        redirect = await client.get("/console")
        unknown = await client.get("/console/nothing.js")
        escapes = [
            await client.get(path)
            for path in (
                "/console/../server/app.py",
                "/console/%2e%2e/%2e%2e/server/app.py",
                "/console/vendor/../../app.py",
                "/console//etc/passwd",
            )
        ]
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert page.headers["cache-control"] == "no-cache"
    policy = page.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "unsafe-inline" not in policy
    assert "unsafe-eval" not in policy and "https:" not in policy
    assert "<script" in page.text and "<style" not in page.text and " style=" not in page.text
    assert script.headers["content-type"].startswith("text/javascript")
    assert "immutable" in script.headers["cache-control"]
    assert styles.headers["content-type"].startswith("text/css")
    assert redirect.status_code == 308 and redirect.headers["location"] == "/console/"
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == 404
    for escape in escapes:
        assert escape.status_code == 404, escape.request.url


async def test_activity_routes_answer_the_workspace_and_only_a_key_s_own_for_standard_keys(
    console: Console,
) -> None:
    generation = await transcribe(console, console.standard.key)
    async with httpx.AsyncClient(base_url=console.api) as client:
        manager = console.management.headers
        reader = console.standard.headers
        activity = (await client.get("/activity?group_by=api_key", headers=manager)).json()
        listed = (await client.get("/generations?status=completed", headers=manager)).json()
        own = (await client.get("/generations", headers=reader)).json()
        other = await client.get(
            f"/generations?api_key_hash={console.management.hash}", headers=reader
        )
        bad_date = await client.get("/activity?date=yesterday", headers=manager)
        bad_limit = await client.get("/generations?limit=500", headers=manager)
        videos = (await client.get("/videos", headers=manager)).json()
        purchases = (await client.get("/credits/purchases", headers=manager)).json()
        no_purchases = await client.get("/credits/purchases", headers=reader)
        me = (await client.get("/key", headers=reader)).json()["data"]
        models = (await client.get("/models?output_modalities=all")).json()
    async with OpenRouter(api_key=console.management.key, server_url=console.api) as sdk:
        by_sdk = await sdk.analytics.get_user_activity_async(
            request={"api_key_hash": console.standard.hash}
        )
    assert [item.model for item in by_sdk.data] == ["local/pocketsphinx-en"]
    row = next(r for r in activity["data"] if r["api_key_hash"] == console.standard.hash)
    assert row["model"] == "local/pocketsphinx-en" and row["requests"] >= 1 and row["usage"] > 0
    assert generation in [g["id"] for g in listed["data"]] and listed["total_count"] >= 1
    assert [g["id"] for g in own["data"]] == [generation]
    assert other.status_code == 403
    assert bad_date.status_code == 400 and bad_date.json()["error"]["metadata"]["param"] == "date"
    assert bad_limit.status_code == 400
    assert isinstance(videos["total_count"], int)
    assert [p["amount"] for p in purchases["data"]] == [10] and purchases["total_count"] == 1
    assert no_purchases.status_code == 403
    # Beyond OpenRouter, for the console: the workspace by name and whether it has a vault.
    assert me["workspace_name"] == "console" and me["intern_programme"] is True
    # The providers of each model, and which take a workspace's own key.
    sphinx = next(m for m in models["data"] if m["id"] == "local/pocketsphinx-en")
    assert sphinx["endpoints"] == [{"provider": "local", "accepts_byok": False}]
    assert any(e["accepts_byok"] for m in models["data"] for e in m["endpoints"])


async def test_a_management_key_runs_the_console(console: Console, browser: Browser) -> None:
    page = await signed_in(browser, console, console.management.key)

    # Keys: create one, shown once, then used for a transcription over REST.
    await nav(page, "Keys").click()
    await page.get_by_label("Name", exact=True).fill("made in console")
    await page.get_by_role("button", name="Create key").click()
    created = page.get_by_test_id("created-key")
    await expect(created).to_have_value(re.compile(r"^sk-"))
    new_key = await created.input_value()
    await expect(page.get_by_role("cell", name="made in console")).to_be_visible()
    await screenshots(page, "keys")
    generation = await transcribe(console, new_key)

    # Usage: the charge by model and by key (the charts' tables).
    await nav(page, "Usage").click()
    await page.get_by_text("By key as a table").click()
    by_key = page.get_by_role("region", name="By key table")
    await expect(by_key.get_by_role("columnheader", name="made in console")).to_be_visible()
    # door.wav: 1.15 s at 0.0001 USD/s
    await expect(by_key.locator("tbody")).to_contain_text(re.compile(r"\$0\.0001\d"))
    await page.get_by_text("By key as a table").click()  # closed again for the picture
    await screenshots(page, "usage")

    # Activity: the generation, its detail page.
    await nav(page, "Activity").click()
    await page.get_by_label("Key", exact=True).select_option(label="made in console")
    await page.get_by_role("button", name="Apply filters").click()
    rows = page.get_by_role("region", name="Generations").locator("tbody tr")
    await expect(rows).to_have_count(1)
    await screenshots(page, "activity")
    await rows.first.get_by_role("link").click()
    await expect(page.get_by_role("heading", name="Generation")).to_be_visible()
    await expect(page.get_by_text(generation)).to_be_visible()
    await screenshots(page, "generation")

    # Video: submitted over REST, played inline once completed.
    async with httpx.AsyncClient(base_url=console.api) as client:
        submitted = await client.post(
            "/videos",
            headers=console.management.headers,
            json={
                "model": "local/renderer",
                "prompt": "a lighthouse",
                "duration": 1,
                "callback_url": console.webhooks.url("/console-hook"),
            },
        )
    assert submitted.status_code == 202, submitted.text
    await nav(page, "Videos").click()
    await expect(page.get_by_role("region", name="Video jobs")).to_contain_text("a lighthouse")
    await screenshots(page, "videos")
    await page.get_by_role("region", name="Video jobs").get_by_role("link").first.click()
    video = page.get_by_test_id("video")
    await expect(video).to_be_visible(timeout=30_000)
    await page.wait_for_function(
        "() => { const v = document.querySelector('video'); "
        "return v && v.readyState >= 2 && v.duration > 0; }",
        timeout=30_000,
    )
    # Played from the content URL through the service worker (byte ranges), not a download.
    assert (await video.get_attribute("src") or "").startswith("/api/v1/videos/")
    stage = page.get_by_role("list", name="Progress").locator("[aria-current=step]")
    await expect(stage).to_have_text("Finished")
    deliveries = page.get_by_role("region", name="Webhook deliveries")
    await expect(deliveries).to_contain_text("video.generation.completed")
    await expect(deliveries.locator("tbody tr").first.locator(".status")).to_have_text(
        "delivered", timeout=15_000
    )
    await expect(deliveries).to_contain_text("HTTP 200")
    await screenshots(page, "video")

    # Vault: store a secret, see its metadata (never the value), delete it.
    await nav(page, "Vault").click()
    await page.get_by_label("Name", exact=True).fill("console_token")
    await page.get_by_label("Value", exact=True).fill("s3cret-value")
    await page.get_by_label("Hosts (comma separated)").fill("api.example.com")
    await page.get_by_role("button", name="Save secret").click()
    secrets_table = page.get_by_role("region", name="Secrets")
    await expect(secrets_table.get_by_role("cell", name="console_token")).to_be_visible()
    assert "s3cret-value" not in await page.content()
    await screenshots(page, "vault")
    await secrets_table.get_by_role("button", name="Delete").click()
    await page.get_by_role("button", name="Delete console_token").click()
    await expect(page.get_by_text("Secret console_token deleted.")).to_be_visible()
    await expect(secrets_table.get_by_role("cell", name="console_token")).to_have_count(0)
    # An intern's vault, chosen by name.
    await page.get_by_label("Vault", exact=True).select_option(label="Intern ada")
    await page.get_by_role("button", name="Show this vault").click()
    await expect(page.get_by_text("Showing intern ada's secrets")).to_be_visible()
    await page.get_by_label("Name", exact=True).fill("intern_token")
    await page.get_by_label("Value", exact=True).fill("intern-value")
    await page.get_by_label("Hosts (comma separated)").fill("api.example.com")
    await page.get_by_role("button", name="Save secret").click()
    await expect(secrets_table.get_by_role("cell", name="intern_token")).to_be_visible()

    # Keys again: a limit with its reset, disable, delete.
    await nav(page, "Keys").click()
    made = page.get_by_role("region", name="Keys").get_by_role("row", name=re.compile("made in"))
    await made.get_by_role("button", name="Set limit").click()
    await made.get_by_label("Limit (USD, empty for none)").fill("5")
    await made.get_by_label("Resets").select_option("weekly")
    await made.get_by_role("button", name="Save limit").click()
    await expect(made.get_by_role("cell", name="$5.00")).to_be_visible()
    await expect(made.get_by_role("cell", name="weekly")).to_be_visible()
    await made.get_by_role("button", name="Disable").click()
    await expect(made.get_by_role("cell", name="disabled")).to_be_visible()
    async with httpx.AsyncClient() as client:
        refused = await client.get(
            f"{console.api}/key", headers={"Authorization": f"Bearer {new_key}"}
        )
    assert refused.status_code == 401
    await made.get_by_role("button", name="Delete").click()
    await made.get_by_role("button", name="Delete made in console").click()
    await expect(made).to_have_count(0)

    await page.goto(f"{console.url}#/credits")
    purchases = page.get_by_role("region", name="Purchases")
    await expect(purchases.get_by_role("cell", name="$10.00")).to_be_visible()
    # Guardrails and provider keys (masked): create, see, delete.
    await nav(page, "Guardrails").click()
    await page.get_by_label("Name", exact=True).fill("console guard")
    await page.get_by_label("Max cost per request (USD)").fill("1")
    await page.get_by_role("button", name="Create guardrail").click()
    guardrails = page.get_by_role("region", name="Guardrails")
    await expect(guardrails.get_by_role("cell", name="console guard")).to_be_visible()
    await screenshots(page, "guardrails")
    await guardrails.get_by_role("button", name="Delete").click()
    await page.get_by_role("button", name="Delete console guard").click()
    await expect(guardrails.get_by_role("cell", name="console guard")).to_have_count(0)
    await nav(page, "Provider keys").click()
    await page.get_by_label("Provider", exact=True).select_option("openai")
    await page.get_by_label("Provider API key").fill("sk-console-byok-0123456789")
    await page.get_by_role("button", name="Add key").click()
    byok = page.get_by_role("region", name="Provider keys")
    await expect(byok.get_by_role("cell", name="openai")).to_be_visible()
    assert "sk-console-byok-0123456789" not in await page.content()
    await screenshots(page, "byok")
    await byok.get_by_role("button", name="Delete").click()
    await byok.get_by_role("button", name=re.compile("^Delete .*6789")).click()
    await expect(byok.get_by_role("cell", name="openai")).to_have_count(0)

    for name in ("credits",):
        await page.goto(f"{console.url}#/{name}")
        await expect(page.locator("main h1")).to_be_visible()
        await screenshots(page, name)
    assert not page.errors  # type: ignore[attr-defined]
    await page.context.close()


async def test_the_operator_runs_the_quickstart_in_the_console(
    console: Console, browser: Browser
) -> None:
    """The README's quickstart without the CLI: the operator key signs in, creates a
    workspace, adds credits and issues its management key; that key creates a standard key,
    which transcribes with the local model; the charge shows in usage."""
    page = await signed_in(browser, console, console.operator_key, first_page="Workspaces")
    await expect(page.get_by_text("operator key", exact=True)).to_be_visible()
    await expect(nav(page, "Keys")).to_have_count(0)  # the operator key is no API key
    await page.get_by_label("Name", exact=True).fill("quickstart")
    await page.get_by_label("Intern programme").check()
    await page.get_by_role("button", name="Create workspace").click()
    table = page.get_by_role("region", name="Workspaces")
    row = table.get_by_role("row", name=re.compile("quickstart"))
    await expect(row.get_by_role("cell", name="on", exact=True)).to_be_visible()

    # A refused amount is explained; a right one lands on the account.
    await row.get_by_role("button", name="Add credits").click()
    await row.get_by_label("Amount (USD)").fill("0.0000001")
    await row.get_by_role("button", name="Add to balance").click()
    await expect(page.get_by_role("alert")).to_contain_text("micro-dollars")
    await row.get_by_label("Amount (USD)").fill("10")
    await row.get_by_role("button", name="Add to balance").click()
    await expect(row.get_by_role("cell", name="$10.00")).to_have_count(2)  # balance, purchased
    await expect(page.get_by_text("Added $10.00 to quickstart.")).to_be_visible()

    await row.get_by_role("button", name="Create management key").click()
    await row.get_by_label("Key name").fill("quickstart admin")
    await row.get_by_role("button", name="Issue management key").click()
    created = page.get_by_test_id("created-key")
    await expect(created).to_have_value(re.compile(r"^sk-gw-v1-"))
    management_key = await created.input_value()
    await screenshots(page, "workspaces")
    # Only the refused amount's answer (the browser logs every 4xx).
    errors: list[str] = page.errors  # type: ignore[attr-defined]
    assert [e for e in errors if "status of 400" not in e] == [] and len(errors) == 1
    errors.clear()

    # The workspace's management key takes over: a standard key, then a transcription.
    await page.get_by_role("button", name="Sign out").click()
    await page.get_by_label("API key").fill(management_key)
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.get_by_role("heading", name="Usage", level=1)).to_be_visible()
    await expect(page.get_by_text("management key")).to_be_visible()
    await nav(page, "Keys").click()
    await page.get_by_label("Name", exact=True).fill("quickstart app")
    await page.get_by_role("button", name="Create key").click()
    app_key = page.get_by_test_id("created-key")
    await expect(app_key).to_have_value(re.compile(r"^sk-gw-v1-"))
    await transcribe(console, await app_key.input_value())
    await nav(page, "Usage").click()
    await page.get_by_text("By key as a table").click()
    by_key = page.get_by_role("region", name="By key table")
    await expect(by_key.get_by_role("columnheader", name="quickstart app")).to_be_visible()
    await expect(by_key.locator("tbody")).to_contain_text(re.compile(r"\$0\.0001\d"))
    await nav(page, "Credits").click()
    await expect(
        page.get_by_role("region", name="Purchases").get_by_role("cell", name="$10.00")
    ).to_be_visible()
    spent = page.locator(".card", has_text="Spent, all time")
    await expect(spent).to_contain_text(re.compile(r"\$0\.0001\d"))
    await screenshots(page, "quickstart-credits")
    assert not page.errors  # type: ignore[attr-defined]
    await page.context.close()


async def test_a_standard_key_cannot_reach_management_pages(
    console: Console, browser: Browser
) -> None:
    page = await signed_in(browser, console, console.standard.key)
    navigation = page.get_by_role("navigation", name="Console pages")
    await expect(navigation.get_by_role("link", name="Activity")).to_be_visible()
    await expect(navigation.get_by_role("link", name="Keys")).to_have_count(0)
    await expect(navigation.get_by_role("link", name="Vault")).to_be_visible()
    for name in ("keys", "credits"):
        await page.goto(f"{console.url}#/{name}")
        await expect(page.get_by_text("This page needs a management key")).to_be_visible()
    await screenshots(page, "standard-key")
    # The key lives in the tab's session storage only: no cookie, nothing in the URL.
    assert await page.context.cookies() == []
    assert console.standard.key not in page.url
    await page.context.close()


async def test_a_wrong_key_is_explained(console: Console, browser: Browser) -> None:
    context = await browser.new_context(viewport=PHONE)
    page = await context.new_page()
    await page.goto(console.url)
    await screenshots(page, "sign-in")
    await page.set_viewport_size(PHONE)
    await page.get_by_label("API key").fill("sk-not-a-key")
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.get_by_role("alert")).to_contain_text("This API key was not accepted")
    await eventually(lambda: page.evaluate("() => sessionStorage.length === 0"))
    await context.close()


async def test_the_console_works_with_the_keyboard_alone(
    console: Console, browser: Browser
) -> None:
    context = await browser.new_context(viewport=PHONE)
    page = await context.new_page()
    await page.goto(console.url)
    await page.keyboard.press("Tab")
    await expect(page.get_by_label("API key")).to_be_focused()
    await page.keyboard.type(console.management.key)
    await page.keyboard.press("Enter")
    heading = page.get_by_role("heading", name="Usage", level=1)
    await expect(heading).to_be_focused()  # focus moves to the page's heading
    # Tab from the top reaches the navigation's links in order; Enter follows one.
    await page.locator("body").focus()
    names: list[str] = []
    while "Activity" not in names:
        await page.keyboard.press("Tab")
        names.append(await page.evaluate("() => document.activeElement.textContent.trim()"))
        assert len(names) < 20, names
    assert names.index("Sign out") < names.index("Usage") < names.index("Activity")
    await page.keyboard.press("Enter")
    await expect(page.get_by_role("heading", name="Activity", level=1)).to_be_focused()
    await context.close()


async def test_the_operator_page_works_with_the_keyboard_alone(
    console: Console, browser: Browser
) -> None:
    context = await browser.new_context(viewport=PHONE)
    page = await context.new_page()
    await page.goto(console.url)
    await page.keyboard.press("Tab")
    await expect(page.get_by_label("API key")).to_be_focused()
    await page.keyboard.type(console.operator_key)
    await page.keyboard.press("Enter")
    await expect(page.get_by_role("heading", name="Workspaces", level=1)).to_be_focused()
    name = page.get_by_label("Name", exact=True)
    for _ in range(20):  # Tab from the heading reaches the form
        if await name.evaluate("(field) => field === document.activeElement"):
            break
        await page.keyboard.press("Tab")
    await expect(name).to_be_focused()
    await page.keyboard.type("keyboard-only")
    await page.keyboard.press("Tab")
    await expect(page.get_by_label("Intern programme")).to_be_focused()
    await page.keyboard.press("Space")
    await page.keyboard.press("Tab")
    await expect(page.get_by_role("button", name="Create workspace")).to_be_focused()
    await page.keyboard.press("Enter")
    row = page.get_by_role("region", name="Workspaces").get_by_role(
        "row", name=re.compile("keyboard-only")
    )
    await expect(row.get_by_role("cell", name="on", exact=True)).to_be_visible()
    await context.close()


# ---- issue 33: the console, second round ----------------------------------------------------


@dataclass
class Fresh:
    workspace: Workspace
    management: IssuedKey
    standard: IssuedKey


async def fresh_workspace(console: Console, name: str, *, interns: bool = False) -> Fresh:
    """A workspace of its own (10 USD), so what a test counts is its own."""
    workspace = await console.admin.workspace(name, intern_programme=interns)
    await console.admin.credits(workspace, "10")
    management = await console.admin.key(workspace, f"{name} admin", management=True)
    standard = await console.admin.key(workspace, f"{name} app")
    return Fresh(workspace, management, standard)


def not_logged(page: Page) -> list[str]:
    return page.errors  # type: ignore[attr-defined,no-any-return]


async def test_the_vault_outside_the_intern_programme_says_who_turns_it_on(
    console: Console, browser: Browser
) -> None:
    """Defect 1: a workspace made as the README says has no intern programme, so no vault: the
    page says so and who turns it on, and offers no form that can only fail."""
    fresh = await fresh_workspace(console, "no-programme")
    page = await signed_in(browser, console, fresh.management.key)
    await nav(page, "Vault").click()
    notice = page.get_by_role("status").filter(has_text="intern programme")
    await expect(notice).to_contain_text("operator")
    await expect(page.get_by_role("button", name="Save secret")).to_have_count(0)
    await expect(page.get_by_role("alert")).to_have_count(0)
    await screenshots(page, "vault-outside-programme")
    assert not_logged(page) == []  # nothing asked that could only be a 404
    await page.context.close()


async def test_guardrails_say_whom_they_apply_to_and_are_edited_assigned_and_budgeted(
    console: Console, browser: Browser
) -> None:
    """Defect 2: the page says an unassigned guardrail applies to every key; a guardrail is
    created with ignored models, a video length, a budget and one key, then edited."""
    fresh = await fresh_workspace(console, "guarded")
    page = await signed_in(browser, console, fresh.management.key)
    await nav(page, "Guardrails").click()
    await expect(page.get_by_text("applies to every key of the workspace")).to_be_visible()
    await page.get_by_label("Name", exact=True).fill("video only")
    await page.get_by_label("Ignored models").fill("local/pocketsphinx-en")
    await page.get_by_label("Max video duration (s)").fill("4")
    await page.get_by_label("Budget per key (USD)").fill("2.5")
    await page.get_by_label("Budget resets").select_option("daily")
    await page.get_by_role("checkbox", name="guarded app").check()
    await page.get_by_role("button", name="Create guardrail").click()
    row = page.get_by_role("region", name="Guardrails").get_by_role(
        "row", name=re.compile("video only")
    )
    await expect(row).to_contain_text("guarded app")
    await expect(row).to_contain_text("local/pocketsphinx-en")
    await expect(row).to_contain_text("$2.50 daily")
    await row.get_by_role("button", name="Edit").click()
    await expect(page.get_by_label("Name", exact=True)).to_have_value("video only")
    await page.get_by_label("Max video duration (s)").fill("6")
    await page.get_by_role("button", name="Save guardrail").click()
    await expect(row.get_by_role("cell", name="6", exact=True)).to_be_visible()
    async with httpx.AsyncClient(base_url=console.api) as client:
        listed = (await client.get("/guardrails", headers=fresh.management.headers)).json()
        (guardrail,) = listed["data"]
        assigned = await client.get(
            f"/guardrails/{guardrail['id']}/assignments/keys", headers=fresh.management.headers
        )
    assert guardrail["max_video_duration_seconds"] == 6
    assert guardrail["ignored_models"] == ["local/pocketsphinx-en"]
    assert guardrail["limit_usd"] == 2.5 and guardrail["reset_interval"] == "daily"
    assert [a["key_hash"] for a in assigned.json()["data"]] == [fresh.standard.hash]
    await screenshots(page, "guardrails-edit")
    assert not_logged(page) == []
    await page.context.close()


async def test_usage_shows_the_workspace_beside_the_key_and_money_exactly(
    console: Console, browser: Browser
) -> None:
    """Defects 3 and 8: a management key's usage names its workspace and shows the workspace's
    spend today beside its own ($0.00), the account's free-model counter apart; Credits shows
    the balance to the micro-dollar; every amount has one format."""
    fresh = await fresh_workspace(console, "spender")
    await transcribe(console, fresh.standard.key)
    async with httpx.AsyncClient(base_url=console.api) as client:
        credits = (await client.get("/credits", headers=fresh.management.headers)).json()["data"]
    spent_micros = round(credits["total_usage"] * 1_000_000)
    assert spent_micros > 0
    page = await signed_in(browser, console, fresh.management.key)
    await expect(page.get_by_test_id("workspace-name")).to_have_text("spender")
    await expect(page.get_by_test_id("usage-daily")).to_have_text("$0.00")
    spent = f"${spent_micros / 1_000_000:.6f}".rstrip("0")
    await expect(page.get_by_test_id("workspace-daily")).to_have_text(spent)
    account = page.get_by_role("region", name="Account")
    await expect(account).to_contain_text("Free-model requests today")
    await expect(page.get_by_role("region", name="This key")).not_to_contain_text("Free-model")
    await nav(page, "Credits").click()
    balance = 10_000_000 - spent_micros
    await expect(page.get_by_test_id("balance")).to_have_text(
        f"${balance // 1_000_000}.{balance % 1_000_000:06d}".rstrip("0")
    )
    formatted = await page.evaluate(
        "async () => { const m = await import('/console/money.js');"
        " return [0, 10, 0.002, 9.991739, 0.00002, 1234.5, -0.25].map((v) => m.usd(v)); }"
    )
    assert formatted == [
        "$0.00",
        "$10.00",
        "$0.002",
        "$9.991739",
        "$0.00002",
        "$1,234.50",
        "-$0.25",
    ]
    await screenshots(page, "credits-exact")
    assert not_logged(page) == []
    await page.context.close()


async def test_a_video_job_shows_what_it_is_and_its_coming_webhook(
    console: Console, browser: Browser
) -> None:
    """Defect 4: list and detail show the prompt, duration, resolution and key; a running job
    with a callback URL says a webhook will be sent, not that none was."""
    fresh = await fresh_workspace(console, "filmmaker")
    async with httpx.AsyncClient(base_url=console.api) as client:
        submitted = await client.post(
            "/videos",
            headers=fresh.standard.headers,
            json={
                "model": "local/renderer",
                "prompt": "a red kite over dunes",
                "duration": 1,
                "callback_url": console.webhooks.url("/filmmaker-hook"),
            },
        )
    assert submitted.status_code == 202, submitted.text
    job_id = submitted.json()["id"]
    page = await signed_in(browser, console, fresh.management.key)

    # The job seen while it runs (the answers held at "in progress", no delivery yet).
    async def running(route) -> None:  # type: ignore[no-untyped-def]
        answer = await route.fetch()
        body = await answer.json()
        body["status"] = "in_progress"
        body.pop("usage", None)
        body["unsigned_urls"] = []
        await route.fulfill(response=answer, body=json.dumps(body))

    async def no_deliveries(route) -> None:  # type: ignore[no-untyped-def]
        await route.fulfill(json={"data": []})

    await page.route(f"**/api/v1/videos/{job_id}", running)
    await page.route(f"**/api/v1/videos/{job_id}/webhooks", no_deliveries)
    await nav(page, "Videos").click()
    jobs = page.get_by_role("region", name="Video jobs")
    await expect(jobs).to_contain_text("a red kite over dunes")
    await expect(jobs).to_contain_text("filmmaker app")
    await jobs.get_by_role("link").first.click()
    details = page.locator("dl.detail")
    await expect(details).to_contain_text("a red kite over dunes")
    await expect(details).to_contain_text("1 s")
    await expect(details).to_contain_text("filmmaker app")
    await expect(page.get_by_text("will be sent to")).to_be_visible()
    await expect(page.get_by_text("No webhook was sent")).to_have_count(0)
    await page.context.close()


async def test_phone_width_keeps_actions_and_legends_on_screen(
    console: Console, browser: Browser
) -> None:
    """Defect 5: at 390 px the workspaces' actions and the usage chart's legend are on
    screen."""
    page = await signed_in(
        browser, console, console.operator_key, first_page="Workspaces", viewport=PHONE
    )
    button = (
        page.get_by_role("region", name="Workspaces")
        .get_by_role("button", name="Add credits")
        .first
    )
    box = await button.bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"]
    await page.context.close()
    fresh = await fresh_workspace(console, "narrow")
    await transcribe(console, fresh.management.key)
    page = await signed_in(browser, console, fresh.management.key, viewport=PHONE)
    legend = page.locator(".u-legend").first
    await expect(legend).to_be_visible()
    overflow = await page.evaluate(
        "() => [...document.querySelectorAll('.u-legend, .chart')]"
        ".map((e) => e.getBoundingClientRect().right).filter((r) => r > window.innerWidth)"
    )
    assert overflow == []
    await page.context.close()


async def test_a_standard_key_uses_its_vault_and_never_asks_what_it_may_not(
    console: Console, browser: Browser
) -> None:
    """Defects 6 and 7: the API takes a standard key's vault writes (the reference scopes the
    vault by the key, and names no management-only vault route), so the console offers the
    vault too and calls a standard key no "read-only" key; pages a standard key may not use
    say so without calling the API (no 403 in the browser's log)."""
    fresh = await fresh_workspace(console, "standard-vault", interns=True)
    page = await signed_in(browser, console, fresh.standard.key)
    await nav(page, "Vault").click()
    await page.get_by_label("Name", exact=True).fill("app_token")
    await page.get_by_label("Value", exact=True).fill("app-value")
    await page.get_by_label("Hosts (comma separated)").fill("api.example.com")
    await page.get_by_role("button", name="Save secret").click()
    secrets = page.get_by_role("region", name="Secrets")
    await expect(secrets.get_by_role("cell", name="app_token")).to_be_visible()
    for name in ("keys", "credits", "guardrails", "byok"):
        await page.goto(f"{console.url}#/{name}")
        await expect(page.get_by_text("This page needs a management key")).to_be_visible()
    assert "read-only" not in await page.content()
    assert not_logged(page) == []
    await page.context.close()


async def test_focus_escape_copy_and_refusals_in_one_wording(
    console: Console, browser: Browser
) -> None:
    """Defect 9: focus after a reload, "Set limit" and a confirmed Delete; Escape closes an
    inline form; Copy says "Copied"; BYOK's provider is a choice; -5 is refused in the API's
    words, as 0 is."""
    fresh = await fresh_workspace(console, "keyboard")
    page = await signed_in(browser, console, fresh.management.key)
    await page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    await page.reload()
    await expect(page.get_by_role("heading", name="Usage", level=1)).to_be_focused()

    await nav(page, "Keys").click()
    await page.get_by_label("Name", exact=True).fill("focus me")
    await page.get_by_label("Limit (USD, optional)").fill("-5")
    await page.get_by_role("button", name="Create key").click()
    await expect(page.get_by_role("alert")).to_contain_text("plain decimal number")
    await page.get_by_label("Limit (USD, optional)").fill("")
    await page.get_by_role("button", name="Create key").click()
    await page.get_by_role("button", name="Copy").click()
    await expect(page.get_by_role("status").filter(has_text="Copied")).to_be_visible()
    row = page.get_by_role("region", name="Keys").get_by_role("row", name=re.compile("focus me"))
    await row.get_by_role("button", name="Set limit").click()
    await expect(row.get_by_label("Limit (USD, empty for none)")).to_be_focused()
    await page.keyboard.press("Escape")
    await expect(row.get_by_role("button", name="Set limit")).to_be_focused()
    await row.get_by_role("button", name="Set limit").click()
    await row.get_by_label("Limit (USD, empty for none)").fill("-5")
    await row.get_by_role("button", name="Save limit").click()
    await expect(page.get_by_role("alert")).to_contain_text("plain decimal number")
    await row.get_by_label("Limit (USD, empty for none)").fill("3")
    await row.get_by_role("button", name="Save limit").click()
    await expect(row.get_by_role("button", name="Set limit")).to_be_focused()
    await row.get_by_role("button", name="Delete").click()
    await row.get_by_role("button", name="Delete focus me").click()
    await expect(row).to_have_count(0)
    assert await page.evaluate("() => document.activeElement !== document.body")

    await nav(page, "Provider keys").click()
    provider = page.get_by_label("Provider", exact=True)
    assert await provider.evaluate("(e) => e.tagName") == "SELECT"
    await provider.select_option("openai")
    await page.context.close()


async def test_the_models_page_lists_the_catalog_at_both_widths(
    console: Console, browser: Browser
) -> None:
    """Missing page: the catalog from GET /models — prices, modalities, availability and
    why not, the providers serving each model."""
    page = await signed_in(browser, console, console.standard.key)
    await nav(page, "Models").click()
    models = page.get_by_role("region", name="Models")
    row = models.get_by_role("row").filter(
        has=page.get_by_text("local/pocketsphinx-en", exact=True)
    )
    await expect(row).to_contain_text("audio")
    await expect(row).to_contain_text("available")
    await expect(row).to_contain_text("local")
    renderer = models.get_by_role("row").filter(has=page.get_by_text("local/renderer", exact=True))
    await expect(renderer).to_contain_text("video")
    for size in (DESKTOP, PHONE):
        await page.set_viewport_size(size)
        await expect(row).to_be_visible()
    await screenshots(page, "models")
    assert not_logged(page) == []
    await page.context.close()


async def test_usage_takes_a_date_range_a_grouping_and_exports_csv(
    console: Console, browser: Browser
) -> None:
    """Missing piece: Usage over a chosen range of days, grouped by model, key or provider,
    and its rows as CSV; at both widths."""
    fresh = await fresh_workspace(console, "analyst")
    await transcribe(console, fresh.standard.key)
    page = await signed_in(browser, console, fresh.management.key)
    today = await page.evaluate("() => new Date().toISOString().slice(0, 10)")
    await page.get_by_label("From (UTC)").fill(today)
    await page.get_by_label("To (UTC)").fill(today)
    await page.get_by_label("Group by").select_option("provider")
    await page.get_by_role("button", name="Show spend").click()
    await page.get_by_text("By provider as a table").click()
    table = page.get_by_role("region", name="By provider table")
    await expect(table.get_by_role("columnheader", name="local")).to_be_visible()
    await expect(table.locator("tbody tr")).to_have_count(1)  # one day
    await expect(table.locator("tbody")).to_contain_text("$0.000115")
    async with page.expect_download() as started:
        await page.get_by_role("button", name="Export CSV").click()
    download = await started.value
    path = await download.path()
    lines = (await asyncio.to_thread(Path(path).read_text)).splitlines()
    assert lines[0] == (
        "date,model,provider,api_key_hash,api_key_name,requests,usage_usd,byok_usage_usd"
    )
    assert lines[1:] == [
        f"{today},local/pocketsphinx-en,local,{fresh.standard.hash},analyst app,1,0.000115,0.00"
    ]
    await expect(page.get_by_role("status").filter(has_text="Exported 1 row")).to_be_visible()
    await page.set_viewport_size(PHONE)
    # On screen across (not in a column off to the side); how far down the page is scrolled
    # after the resize is the browser's business.
    box = await page.get_by_role("button", name="Export CSV").bounding_box()
    assert box is not None and 0 <= box["x"] and box["x"] + box["width"] <= PHONE["width"]
    await screenshots(page, "usage-range")
    assert not_logged(page) == []
    await page.context.close()


async def test_keys_show_kind_expiry_and_last_use_at_both_widths(
    console: Console, browser: Browser
) -> None:
    """Missing piece: a key is created with an expiry; the list says which keys are
    management keys, when each expires and when it was last used."""
    fresh = await fresh_workspace(console, "expiring")
    await transcribe(console, fresh.standard.key)
    page = await signed_in(browser, console, fresh.management.key)
    await nav(page, "Keys").click()
    await page.get_by_label("Name", exact=True).fill("short lived")
    await page.get_by_label("Expires (UTC, optional)").fill("2099-01-02T03:04")
    await page.get_by_role("button", name="Create key").click()
    keys = page.get_by_role("region", name="Keys")
    short_lived = keys.get_by_role("row", name=re.compile("short lived"))
    await expect(short_lived).to_contain_text("2099-01-02 03:04:00 UTC")
    await expect(short_lived).to_contain_text("standard")
    admin = keys.get_by_role("row", name=re.compile("expiring admin"))
    await expect(admin).to_contain_text("management")
    app = keys.get_by_role("row", name=re.compile("expiring app"))
    await expect(app).to_contain_text(re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"))
    for size in (PHONE, DESKTOP):
        await page.set_viewport_size(size)
        await expect(short_lived).to_be_visible()
        # Its actions on screen at either width (a phone shows one card per key).
        box = await short_lived.get_by_role("button", name="Set limit").bounding_box()
        assert box is not None and 0 <= box["x"] and box["x"] + box["width"] <= size["width"]
    await screenshots(page, "keys-expiry")
    assert not_logged(page) == []
    await page.context.close()


async def test_the_operator_sees_every_workspace_and_disables_one(
    console: Console, browser: Browser
) -> None:
    """Missing piece: the operator's view — each workspace's balance, spend, requests and
    keys on one page; disabling one says first what happens to its keys and jobs, refuses its
    keys (401) while disabled, and Enable restores them."""
    fresh = await fresh_workspace(console, "to-disable")
    await transcribe(console, fresh.standard.key)
    page = await signed_in(browser, console, console.operator_key, first_page="Workspaces")
    row = page.get_by_role("region", name="Workspaces").get_by_role(
        "row", name=re.compile("to-disable")
    )
    await expect(row.get_by_role("cell", name="$9.999885", exact=True)).to_be_visible()
    await expect(row.get_by_role("cell", name="$0.000115", exact=True)).to_be_visible()
    await expect(row.get_by_role("cell", name="1", exact=True)).to_be_visible()  # requests
    await expect(row.get_by_role("cell", name="2", exact=True)).to_be_visible()  # keys
    await row.get_by_role("button", name="Disable").click()
    await expect(row).to_contain_text("Its 2 keys will be refused (401) at once")
    await expect(row).to_contain_text("0 unfinished video jobs still finish")
    await row.get_by_role("button", name="Disable to-disable").click()
    await expect(row.get_by_role("cell", name="disabled", exact=True)).to_be_visible()
    async with httpx.AsyncClient(base_url=console.api) as client:
        refused = await client.get("/key", headers=fresh.standard.headers)
        assert refused.status_code == 401
        assert refused.json()["error"]["message"] == "API key's workspace is disabled"
        await screenshots(page, "workspaces-disabled")
        await row.get_by_role("button", name="Enable").click()
        await expect(row.get_by_role("cell", name="active", exact=True)).to_be_visible()
        again = await client.get("/key", headers=fresh.management.headers)
    assert again.status_code == 200
    assert not_logged(page) == []
    await page.context.close()


async def test_a_key_is_rotated_with_a_grace_period(console: Console, browser: Browser) -> None:
    """Missing piece: rotation — a new key in the old one's place (its guardrails too), shown
    once; the old one works for the grace period, then expires (at once with 0)."""
    fresh = await fresh_workspace(console, "rotating")
    async with httpx.AsyncClient(base_url=console.api) as client:
        made = await client.post(
            "/guardrails", headers=fresh.management.headers, json={"name": "rotating rule"}
        )
        rule = made.json()["data"]["id"]
        await client.post(
            f"/guardrails/{rule}/assignments/keys",
            headers=fresh.management.headers,
            json={"key_hashes": [fresh.standard.hash]},
        )
    page = await signed_in(browser, console, fresh.management.key)
    await nav(page, "Keys").click()
    row = page.get_by_role("region", name="Keys").get_by_role(
        "row", name=re.compile("rotating app")
    )
    await row.get_by_role("button", name="Rotate").click()
    await expect(row).to_contain_text("keeps working for the grace period")
    await row.get_by_role("button", name="Rotate rotating app").click()
    created = page.get_by_test_id("created-key")
    await expect(created).to_have_value(re.compile(r"^sk-gw-v1-"))
    await expect(page.get_by_text("The key it replaces")).to_contain_text("then expires")
    new_key = await created.input_value()
    await screenshots(page, "keys-rotated")
    async with httpx.AsyncClient(base_url=console.api) as client:
        new = await client.get("/key", headers={"Authorization": f"Bearer {new_key}"})
        old = await client.get("/key", headers=fresh.standard.headers)
        assigned = await client.get(
            f"/guardrails/{rule}/assignments/keys", headers=fresh.management.headers
        )
        new_hash = next(
            k["hash"]
            for k in (await client.get("/keys", headers=fresh.management.headers)).json()["data"]
            if k["name"] == "rotating app" and k["hash"] != fresh.standard.hash
        )
        at_once = await client.post(
            f"/keys/{new_hash}/rotate", headers=fresh.management.headers, json={"grace_seconds": 0}
        )
        after = await client.get("/key", headers={"Authorization": f"Bearer {new_key}"})
        too_long = await client.post(
            f"/keys/{at_once.json()['data']['hash']}/rotate",
            headers=fresh.management.headers,
            json={"grace_seconds": 10**8},
        )
        by_standard = await client.post(
            f"/keys/{new_hash}/rotate", headers=fresh.standard.headers, json={}
        )
    assert new.status_code == 200 and new.json()["data"]["expires_at"] is None
    assert old.status_code == 200 and old.json()["data"]["expires_at"] is not None
    assert {a["key_hash"] for a in assigned.json()["data"]} == {fresh.standard.hash, new_hash}
    assert at_once.status_code == 201 and at_once.json()["key"].startswith("sk-gw-v1-")
    assert after.status_code == 401 and after.json()["error"]["message"] == "API key has expired"
    assert too_long.status_code == 400
    assert too_long.json()["error"]["metadata"]["param"] == "grace_seconds"
    assert by_standard.status_code == 403
    assert not_logged(page) == []
    await page.context.close()


async def test_video_content_answers_byte_ranges(console: Console) -> None:
    """Defect 4: the player asks byte ranges (Range), so it plays before the whole file came:
    206 with Content-Range for one range; the whole file (200) for none; 416 for one no byte
    of the video satisfies."""
    async with httpx.AsyncClient(base_url=console.api, timeout=60) as client:
        submitted = await client.post(
            "/videos",
            headers=console.management.headers,
            json={"model": "local/renderer", "prompt": "ranges", "duration": 1},
        )
        job = submitted.json()["id"]

        async def completed() -> bool:
            answer = await client.get(f"/videos/{job}", headers=console.management.headers)
            return bool(answer.json()["status"] == "completed")

        await eventually(completed, within=30)
        url = f"/videos/{job}/content?index=0"
        whole = await client.get(url, headers=console.management.headers)
        first = await client.get(url, headers={**console.management.headers, "Range": "bytes=0-99"})
        tail = await client.get(url, headers={**console.management.headers, "Range": "bytes=-10"})
        beyond = await client.get(
            url, headers={**console.management.headers, "Range": f"bytes={10**9}-"}
        )
        no_key = await client.get(url, headers={"Range": "bytes=0-99"})
    size = len(whole.content)
    assert whole.status_code == 200 and whole.headers["accept-ranges"] == "bytes" and size > 100
    assert first.status_code == 206 and first.content == whole.content[:100]
    assert first.headers["content-range"] == f"bytes 0-99/{size}"
    assert tail.status_code == 206 and tail.content == whole.content[-10:]
    assert beyond.status_code == 416 and beyond.headers["content-range"] == f"bytes */{size}"
    assert no_key.status_code == 401
