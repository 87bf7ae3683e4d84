"""Operations that need Kafka or a process are carried out by a lab agent: they go through the
command channel (a row in PostgreSQL), never a Kafka client in this process."""
from __future__ import annotations

from ..domain.commands import Command, encode
from ..store import command_channel
from .registry import Busy, Context, InvalidRequest, NotFound

NoAgent = command_channel.NoAgent


class AgentTimedOut(NoAgent):
    """No lab agent finished the operation in time: it was withdrawn (nothing was done), or an agent
    took it late and carries it out still. Not bad input: the API answers 503 with the reason."""


def run_command(ctx: Context, verb: str, command: Command, *, agent_id: str | None = None,
                field: str = "request", timeout: float = 30.0) -> dict:
    """Carry out ``verb`` with its typed ``command`` on an agent; its refusals become InvalidRequest
    naming their field."""
    try:
        return command_channel.run(ctx.engine, ctx.lab.name, verb, encode(verb, command), agent_id=agent_id,
                                   timeout=timeout, waiting=ctx.waiting)
    except command_channel.CommandNotFound as error:
        raise NotFound(str(error)) from None
    except command_channel.NoAgent:
        raise
    except command_channel.CommandTimedOut as error:
        raise AgentTimedOut(str(error)) from None
    except command_channel.CommandError as error:
        message = str(error)
        named = message.split(":", 1)[0] if ":" in message else ""
        if named == "busy":  # the agent found the lab busy (two requests at once): what runs, how to stop it
            raise Busy(message.removeprefix("busy: ")) from None
        raise InvalidRequest(named if named.isidentifier() else field, message) from None
