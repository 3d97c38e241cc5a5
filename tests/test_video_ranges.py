"""GET /videos/{id}/content with HTTP Range (RFC 9110 §14) through Envoy, on the local folder
backend (the several-hosts tests do the same on object storage): one range is answered 206
with Content-Range and its bytes; an unsatisfiable one 416 with `Content-Range: bytes */size`
in the documented error shape; several ranges, another unit or a malformed header are
ignored (200, the whole video); a 200 says `Accept-Ranges: bytes`."""

from __future__ import annotations

import httpx
import pytest

from testkit.admin import IssuedKey
from tests.conftest import Stack
from tests.test_videos import submit, wait_for


@pytest.fixture
async def funded(stack: Stack, unique: str) -> IssuedKey:
    workspace = await stack.admin.workspace(f"ranges-{unique}")
    await stack.admin.credits(workspace, "10")
    return await stack.admin.key(workspace, "video")


async def test_content_is_served_by_range(stack: Stack, funded: IssuedKey) -> None:
    response = await submit(
        stack, funded, {"model": "local/renderer", "prompt": "r", "duration": 1}
    )
    job_id = response.json()["id"]
    await wait_for(stack, funded, job_id, "completed")
    url = f"{stack.base_url}/videos/{job_id}/content"
    async with httpx.AsyncClient(timeout=30) as client:

        async def get(range_: str | None) -> httpx.Response:
            headers = dict(funded.headers)
            if range_ is not None:
                headers["Range"] = range_
            return await client.get(url, headers=headers)

        whole = await get(None)
        assert whole.status_code == 200 and whole.headers["accept-ranges"] == "bytes"
        video = whole.content
        size = len(video)
        assert size > 1000
        for asked, first, last in (
            ("bytes=0-99", 0, 99),
            ("bytes=100-", 100, size - 1),
            ("bytes=-10", size - 10, size - 1),
            (f"bytes=10-{size * 2}", 10, size - 1),  # past the end: up to the end
            (f"bytes=-{size + 5}", 0, size - 1),  # a suffix longer than the video: all of it
        ):
            part = await get(asked)
            assert part.status_code == 206, (asked, part.status_code, part.text[:200])
            assert part.headers["content-range"] == f"bytes {first}-{last}/{size}", asked
            assert part.headers["content-type"] == "video/mp4"
            assert part.headers.get("content-length") == str(last + 1 - first), part.headers
            assert part.content == video[first : last + 1], asked
        for unsatisfiable in (f"bytes={size}-", f"bytes={size + 10}-{size + 20}", "bytes=-0"):
            refused = await get(unsatisfiable)
            assert refused.status_code == 416, unsatisfiable
            assert refused.headers["content-range"] == f"bytes */{size}"
            assert refused.json()["error"]["code"] == 416
        for ignored in ("bytes=0-1,5-9", "items=0-5", "bytes=5-1", "bytes=x-y", "bytes="):
            plain = await get(ignored)
            assert plain.status_code == 200, ignored
            assert plain.content == video
