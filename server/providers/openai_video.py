"""The OpenAI videos API (https://platform.openai.com/docs/api-reference/videos):
`POST {base}/videos`, `GET {base}/videos/{id}`, `GET {base}/videos/{id}/content` (MP4), and
`POST {base}/videos/{id}/remix` `{prompt}` to continue a completed video (the gateway's
`previous_job_id`). The API has no cancel (DELETE removes a finished video only).

Checked 2026-11-27 against https://platform.openai.com/docs/api-reference/videos (create:
`model`, `prompt`, `seconds` "4" | "8" | "12" as a string, `size` "720x1280" | "1280x720" |
"1024x1792" | "1792x1024"; statuses queued, in_progress, completed, failed; Bearer key) and
https://developers.openai.com/api/docs/deprecations: OpenAI deprecated the Videos API,
`sora-2` and `sora-2-pro` on 2026-03-24 and removed them from the API on 2026-09-24, naming
no replacement. The adapter is kept for compatible servers (the fakes, or a provider that
speaks this protocol); OpenAI's own endpoint no longer answers it. provider.options are
added to the body, never over the model, seconds and size the job is charged for."""

from __future__ import annotations

from typing import Any

from server.providers.endpoint import Endpoint
from server.providers.video import VideoCall, VideoProgress
from server.providers.video_tasks import (
    TASK_ID,
    TaskSpec,
    TaskVideoAdapter,
    field_of,
    merged,
    states_of,
)


def video_body(call: VideoCall) -> dict[str, Any]:
    params = call.params
    return merged(
        {
            "model": call.model,
            "prompt": params.get("prompt", ""),
            "seconds": str(params["duration"]),
            "size": f"{params['width']}x{params['height']}",
        },
        call.options,
    )


SPEC = TaskSpec(
    request=lambda call: ("videos", video_body(call)),
    task_id=lambda answer, path, endpoint: answer.get("id"),
    id_pattern=TASK_ID,
    poll_path="videos/{task}",
    state=lambda answer: answer.get("status"),
    states=states_of(
        running=("queued", "in_progress", "processing", "pending"),
        succeeded="completed",
        failed=("failed",),
    ),
    videos=lambda answer: [],
    content_path="videos/{task}/content",  # the MP4, read with the key
    error=lambda answer: field_of(answer, "error", "message"),
)


class OpenAIVideoAdapter(TaskVideoAdapter):
    spec = SPEC

    async def continue_job(
        self, endpoint: Endpoint, previous_provider_job_id: str, call: VideoCall
    ) -> VideoProgress:
        """A remix of the finished video under the new prompt (its size and length are the
        original's: the remix endpoint takes only the prompt)."""
        path = f"videos/{self._checked(previous_provider_job_id)}/remix"
        body = {"prompt": call.params.get("prompt", "")}
        answer = await self._answer(endpoint, "POST", path, "submit", body)
        return VideoProgress(state="running", provider_job_id=self._checked(answer.get("id")))
