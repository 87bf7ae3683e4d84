"""Field types and field declarations shared by the argument models: each carries its limits and
its description, so the API, the forms, the CLI, the scenario files and the OpenAPI document say
the same thing.

    count: Whole = within(Limits.BURST, "burst: how many events", default=10)
    group: str = named("the consumer group (local to the lab)", default="payments")
"""
from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Annotated, Any

from pydantic import AfterValidator, AliasChoices, BeforeValidator, Field

from ..domain.events import ACCOUNT_ID, TRANSACTION_ID
from ..domain.lab import NAME, NAME_RULE
from ..domain.vocabulary import Limits

# The sentence a person reads when a value does not match a field's pattern.
PATTERN_RULES = {
    NAME.pattern: NAME_RULE,
    ACCOUNT_ID.pattern: "choose an account (1-32 letters, digits, _ or -)",
    TRANSACTION_ID.pattern: "1-64 letters, digits or ._:-",
}


def _no_bool(value: Any) -> Any:
    # bool is an int in Python; a number field must not take true/false for 1/0.
    if isinstance(value, bool):
        raise ValueError("must be a number, not true/false")
    return value


def _amount_text(value: Any) -> Any:
    # A number typed as JSON (12.5) reads as the same text a form sends ("12.5"); a comma is a decimal point.
    return str(value).strip().replace(",", ".") if isinstance(value, (int, float, Decimal)) else value


def _amount_in_range(value: str | None) -> str | None:
    if value is None:
        return value
    try:
        amount = Decimal(value.strip().replace(",", "."))
    except InvalidOperation:
        raise ValueError("must be a positive amount like 100 or 12.50") from None
    most = Limits.AMOUNT_CENTS[1]
    if not amount.is_finite() or amount.as_tuple().exponent < -2 or not Decimal("0.01") <= amount <= most / 100:
        raise ValueError(f"must be from 0.01 to {most / 100:,.2f}, two decimals at most")
    return str(amount)


Whole = Annotated[int, BeforeValidator(_no_bool)]
Number = Annotated[float, BeforeValidator(_no_bool)]
# An amount in currency units, as text ("12.50"): exact, two decimals at most, within the credit limits.
Amount = Annotated[str | None, BeforeValidator(_amount_text), AfterValidator(_amount_in_range)]


def _aliases(name_and_aliases: tuple[str, ...]) -> AliasChoices | None:
    return AliasChoices(*name_and_aliases) if name_and_aliases else None


def within(bounds: tuple[Any, Any], description: str, *aliases: str, default: Any = None, unit: str = "") -> Any:
    """A number from ``bounds[0]`` to ``bounds[1]`` (inclusive). ``aliases``, when given, are every
    name the field accepts, its own first (scenario files keep their shorter words)."""
    low, high = bounds
    finite = {"allow_inf_nan": False} if isinstance(low, float) or isinstance(high, float) or unit else {}
    return Field(default, ge=low, le=high, description=f"{description} ({low}-{high}{unit})",
                 validation_alias=_aliases(aliases), **finite)


def named(description: str, *aliases: str, default: Any = None) -> Any:
    """A name: a lowercase letter, then up to 23 lowercase letters, digits or _."""
    return Field(default, pattern=NAME.pattern, max_length=Limits.NAME_LENGTH, description=description,
                 validation_alias=_aliases(aliases))


def account(default: Any = None) -> Any:
    return Field(default, pattern=ACCOUNT_ID.pattern, description="an account id, like acc-1",
                 validation_alias=AliasChoices("account_id", "account"))


def transaction(default: Any = None) -> Any:
    return Field(default, pattern=TRANSACTION_ID.pattern,
                 description="the business id (like a PIX endToEndId); new when omitted")


def consumer_id() -> Any:
    # A PostgreSQL integer: a larger id could not name a row, so it is refused as input.
    return Field(ge=0, le=2**31 - 1, description="the consumer's id, as `GET /state` lists it")
