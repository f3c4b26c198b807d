"""A graph that asks for approval (an interrupt) before it acts; run as a
script by the LangGraph test, once to start it and once, in another
process, to resume it from Engram.

    python langgraph_graph.py ADDRESS SCOPE THREAD start|resume
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from engram_client.langgraph import EngramSaver


class State(TypedDict, total=False):
    request: str
    steps: list[str]
    approved: str


def plan(state: State) -> State:
    return {"steps": [*state.get("steps", []), f"planned {state['request']}"]}


def approve(state: State) -> State:
    answer = interrupt({"question": f"run {state['request']}?"})
    return {"approved": answer, "steps": [*state["steps"], "approved"]}


def act(state: State) -> State:
    return {"steps": [*state["steps"], f"ran {state['request']} ({state['approved']})"]}


def build(saver: EngramSaver):  # type: ignore[no-untyped-def]
    graph = StateGraph(State)
    graph.add_node("plan", plan)
    graph.add_node("approve", approve)
    graph.add_node("act", act)
    graph.add_edge(START, "plan")
    graph.add_edge("plan", "approve")
    graph.add_edge("approve", "act")
    graph.add_edge("act", END)
    return graph.compile(checkpointer=saver)


def main() -> None:
    address, scope, thread, step = sys.argv[1:5]
    saver = EngramSaver(address, scope=scope)
    config = {"configurable": {"thread_id": thread}}
    if step == "start":
        # The blocking path: invoke stops at the interrupt.
        result = build(saver).invoke({"request": "the migration"}, config)
        print(json.dumps({"interrupts": [i.value for i in result["__interrupt__"]]}))
    else:
        # The asyncio path, in a new process: everything comes from Engram.
        async def resume() -> dict[str, object]:
            graph = build(saver)
            before = await graph.aget_state(config)
            result = await graph.ainvoke(Command(resume="yes"), config)
            await saver.aclose()
            return {"next_before": list(before.next), "steps": result["steps"]}

        print(json.dumps(asyncio.run(resume())))
    saver.close()


if __name__ == "__main__":
    main()
