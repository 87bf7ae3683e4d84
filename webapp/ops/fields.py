"""Field types shared by the argument models: each carries its limits and its description, so the
API, the forms, the CLI, the scenario files and the OpenAPI document say the same thing."""
from __future__ import annotations

from typing import Annotated, Any

from pydantic import AliasChoices, BeforeValidator, Field

from ..domain.lab import NAME, NAME_RULE
from ..events import ACCOUNT_ID, TRANSACTION_ID

# The sentence a person reads when a value does not match a field's pattern.
PATTERN_RULES = {
    NAME.pattern: NAME_RULE,
    ACCOUNT_ID.pattern: "choose an account (1-32 letters, digits, _ or -)",
    TRANSACTION_ID.pattern: "1-64 letters, digits or ._:-",
}


def _no_bool(value: Any) -> Any:
    # bool is an int in Python; a whole-number field must not take true/false for 1/0.
    if isinstance(value, bool):
        raise ValueError("must be a whole number, not true/false")
    return value


def Whole(bounds: tuple[int, int], description: str, *aliases: str) -> Any:
    """A whole number within ``bounds`` (inclusive)."""
    low, high = bounds
    return Annotated[int, Field(ge=low, le=high, description=f"{description} ({low}-{high})",
                                validation_alias=AliasChoices(*aliases) if aliases else None),
                     BeforeValidator(_no_bool)]


def Seconds(bounds: tuple[float, float], description: str, *aliases: str) -> Any:
    low, high = bounds
    return Annotated[float, Field(ge=low, le=high, allow_inf_nan=False, description=f"{description} ({low}-{high} s)",
                                  validation_alias=AliasChoices(*aliases) if aliases else None),
                     BeforeValidator(_no_bool)]


def Name(description: str, *aliases: str) -> Any:
    return Annotated[str, Field(pattern=NAME.pattern, max_length=24, description=description,
                                validation_alias=AliasChoices(*aliases) if aliases else None)]


# A consumer's id as the database holds it (a PostgreSQL integer).
ConsumerId = Annotated[int, Field(ge=0, le=2**31 - 1, description="the consumer's id, as `GET /state` lists it"),
                       BeforeValidator(_no_bool)]
AccountId = Annotated[str, Field(pattern=ACCOUNT_ID.pattern, description="an account id, like acc-1",
                                 validation_alias=AliasChoices("account_id", "account"))]
TransactionId = Annotated[str, Field(pattern=TRANSACTION_ID.pattern,
                                     description="the business id (like a PIX endToEndId); new when omitted")]
