"""An ADK agent whose model is scripted (no network), run by the ADK test
as a script: once to hold a conversation, once, in another process, to
resume it from Engram.

    python adk_agent.py ADDRESS SESSION start|resume
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncGenerator
from typing import Any

from google.adk.agents import LlmAgent
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import Runner
from google.adk.tools.tool_context import ToolContext
from google.genai import types

from engram_client.adk import EngramMemoryService, EngramSessionService

APP, USER = "travel", "alice"


def get_weather(city: str, tool_context: ToolContext) -> dict[str, Any]:
    """The weather in a city."""
    tool_context.state["user:home_city"] = city
    tool_context.state["app:weather_calls"] = tool_context.state.get("app:weather_calls", 0) + 1
    tool_context.state["temp:scratch"] = "never stored"
    return {"city": city, "forecast": "sunny", "celsius": 21}


class ScriptedLlm(BaseLlm):
    """Answers from a script: a weather question calls the tool, a tool
    result is summarised, anything else is acknowledged with how many
    messages of history the request carried (what came back from Engram)."""

    model: str = "scripted"

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        last = llm_request.contents[-1]
        part = last.parts[0] if last.parts else types.Part()
        if part.function_response is not None:
            result = part.function_response.response or {}
            text = f"It is {result['forecast']} and {result['celsius']} C in {result['city']}."
            reply = types.Content(role="model", parts=[types.Part(text=text)])
        elif part.text and "weather" in part.text:
            call = types.FunctionCall(name="get_weather", args={"city": "Paris"})
            reply = types.Content(role="model", parts=[types.Part(function_call=call)])
        else:
            text = f"Noted; I see {len(llm_request.contents)} messages of history."
            reply = types.Content(role="model", parts=[types.Part(text=text)])
        yield LlmResponse(content=reply)


def runner(address: str) -> Runner:
    agent = LlmAgent(
        name="helper",
        model=ScriptedLlm(),
        instruction="Help with travel.",
        tools=[get_weather],
        output_key="last_reply",
    )
    return Runner(
        agent=agent,
        app_name=APP,
        session_service=EngramSessionService(address),
        memory_service=EngramMemoryService(address),
    )


async def say(run: Runner, session_id: str, text: str) -> list[str]:
    message = types.Content(role="user", parts=[types.Part(text=text)])
    replies = []
    async for event in run.run_async(user_id=USER, session_id=session_id, new_message=message):
        if event.content and event.content.parts and event.content.parts[0].text:
            replies.append(event.content.parts[0].text)
    return replies


async def main() -> None:
    address, session_id, step = sys.argv[1:4]
    run = runner(address)
    if step == "start":
        await run.session_service.create_session(app_name=APP, user_id=USER, session_id=session_id)
        replies = await say(run, session_id, "hello")
        replies += await say(run, session_id, "what is the weather in Paris?")
        print(json.dumps({"replies": replies}))
        return
    session = await run.session_service.get_session(app_name=APP, user_id=USER, session_id=session_id)
    assert session is not None
    before = {
        "state": session.state,
        "events": [(e.author, bool(e.get_function_calls()), bool(e.get_function_responses())) for e in session.events],
    }
    replies = await say(run, session_id, "thanks")
    assert run.memory_service is not None
    memory = await run.memory_service.search_memory(app_name=APP, user_id=USER, query="sunny Paris")
    print(
        json.dumps(
            {
                **before,
                "replies": replies,
                "memory": [part.text for m in memory.memories for part in m.content.parts or []],
            }
        )
    )


if __name__ == "__main__":
    asyncio.run(main())
