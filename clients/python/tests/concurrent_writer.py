"""One of several processes writing the same ADK session or LangGraph
thread at once, for the concurrency test.

    python concurrent_writer.py adk|langgraph ADDRESS TARGET WRITER COUNT
"""

from __future__ import annotations

import asyncio
import sys
import uuid

from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.genai import types
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import CheckpointMetadata, empty_checkpoint

from engram_client.adk import EngramSessionService
from engram_client.langgraph import EngramSaver


async def adk(address: str, session_id: str, writer: str, count: int) -> None:
    service = EngramSessionService(address)
    session = await service.get_session(app_name="race", user_id="u", session_id=session_id)
    assert session is not None
    for n in range(count):
        event = Event(
            author="user",
            invocation_id=f"{writer}-{n}",
            content=types.Content(role="user", parts=[types.Part(text=f"{writer} {n}")]),
            actions=EventActions(state_delta={f"last_{writer}": n}),
        )
        await service.append_event(session, event)
    await service.close()


async def langgraph(address: str, thread: str, writer: str, count: int) -> None:
    saver = EngramSaver(address, scope="race")
    config: RunnableConfig = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    for n in range(count):
        # LangGraph keeps metadata keys it does not know (here "writer").
        metadata: CheckpointMetadata = {"source": "loop", "step": n, "writer": writer}  # type: ignore[typeddict-unknown-key]
        stored = await saver.aput(config, empty_checkpoint(), metadata, {})
        await saver.aput_writes(stored, [("messages", f"{writer} {n}")], task_id=str(uuid.uuid4()))
        config = stored
    await saver.aclose()


if __name__ == "__main__":
    mode, address, target, writer, count = sys.argv[1:6]
    run = adk if mode == "adk" else langgraph
    asyncio.run(run(address, target, writer, int(count)))
