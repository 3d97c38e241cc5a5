"""The web console (/console/) in a real browser — Debian's chromium driven by Playwright,
never a downloaded browser — against the real stack (`gateway up` of this module's own), plus
the REST routes it reads (/activity, /generations, /videos, /videos/{id}/webhooks) end to end.

Screenshots of every page at desktop (1280x800) and phone (390x844) width are written to
test-artifacts/console/ (gitignored). The browser waits on elements, never on time."""

from __future__ import annotations

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
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts" / "console"
DESKTOP = {"width": 1280, "height": 800}
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
    browser: Browser, console: Console, key: str, first_page: str = "Usage"
) -> Page:
    context = await browser.new_context(viewport=DESKTOP)
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
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
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
    await page.get_by_role("region", name="Video jobs").get_by_role("link").first.click()
    video = page.get_by_test_id("video")
    await expect(video).to_be_visible(timeout=30_000)
    await page.wait_for_function(
        "() => { const v = document.querySelector('video'); "
        "return v && v.readyState >= 2 && v.duration > 0; }",
        timeout=30_000,
    )
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
    await page.get_by_label("Provider", exact=True).fill("openai")
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
    await expect(row.get_by_role("cell", name="$10.00")).to_be_visible()
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
    for name in ("keys", "credits", "vault"):
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
