"""LangGraph on Engram: ``EngramSaver`` (checkpoints) and ``EngramStore``
(long-term memory). Install with ``pip install engram-client[langgraph]``.

    from engram_client.langgraph import EngramSaver, EngramStore

    graph = builder.compile(
        checkpointer=EngramSaver("engram:50051", token=token),
        store=EngramStore("engram:50051", token=token),
    )
"""

from .saver import EngramSaver
from .store import EngramStore

__all__ = ["EngramSaver", "EngramStore"]
