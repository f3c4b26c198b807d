"""The clients an integration uses, made once from a target or a client.

An integration (the LangGraph saver and store, the ADK services) is built
from a target and keyword options the way a client is, or from a client of
either flavour. Its sync methods use one blocking client; its async methods
use an asyncio client per event loop, since a ``grpc.aio`` channel belongs
to the loop it was made in (a given asyncio client is used as it is).
"""

from __future__ import annotations

import asyncio
from typing import Any

from ._client import Engram
from ._requests import Settings
from .aio import AsyncEngram

#: What an integration is built from.
Target = str | Engram | AsyncEngram


class Clients:
    def __init__(self, target: Target, token: str | None, options: dict[str, Any]) -> None:
        self._sync: Engram | None = None
        self._async: dict[int, AsyncEngram] = {}
        self._given: AsyncEngram | None = None
        self._owned = True
        if isinstance(target, Engram):
            self._sync, self._owned = target, False
            self.settings = target.settings
        elif isinstance(target, AsyncEngram):
            self._given, self._owned = target, False
            self.settings = target.settings
        else:
            self.settings = Settings(target, token, options)

    def sync(self) -> Engram:
        if self._sync is None:
            self._sync = Engram(self.settings.target, self.settings.token, **self.settings.options)
        return self._sync

    def aio(self) -> AsyncEngram:
        if self._given is not None:
            return self._given
        loop = id(asyncio.get_running_loop())
        if loop not in self._async:
            self._async[loop] = AsyncEngram(
                self.settings.target, self.settings.token, **self.settings.options
            )
        return self._async[loop]

    def close(self) -> None:
        """Closes the blocking client, unless it was given."""
        if self._sync is not None and self._owned:
            self._sync.close()
        self._sync = None

    async def aclose(self) -> None:
        """Closes this loop's asyncio client, unless it was given."""
        client = self._async.pop(id(asyncio.get_running_loop()), None)
        if client is not None:
            await client.close()
