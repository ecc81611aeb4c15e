"""What a cartridge declares in cartridge.yaml, as pydantic models: entities, relations, event types and their
payloads, rules, the memory policy and limits. keel.cartridge loads and cross-checks a folder into these;
keel.projection compiles an event type's `project:` steps and keel.envelope its payload schema from them."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator, model_validator

from .limits import Limits
from .times import parse_duration

MAX_VERSION = 2**31 - 1        # the largest version an event type or an envelope may name


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EntitySpec(_Strict):
    description: str = ""
    ref: str | None = None


class RelationSpec(_Strict):
    """A relation between two entity types. An end may name another cartridge's type as `<cartridge>.<type>`
    (a cross-cartridge relation): its entities are that cartridge's, referred to by their own ids."""
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    from_: str = Field(alias="from")
    to: str
    description: str = ""

    def end_type(self, end: str) -> str:
        """The entity type an end's ids carry: the type itself, or the type part of `<cartridge>.<type>`."""
        return (self.from_ if end == "from" else self.to).rpartition(".")[2]


class FieldSpec(_Strict):
    """One payload field: its type and whether it may be absent."""
    type: str
    optional: bool = False


class EventSpec(_Strict):
    subject: str
    owner: str
    description: str = ""
    payload: dict[str, str] = Field(default_factory=dict)
    project: list[Any] | None = None      # declarative steps (keel.projection) instead of a Python handler
    version: StrictInt = Field(1, ge=1, le=MAX_VERSION)    # the payload above is this version's (keel.upcast)
    upcast: dict[StrictInt, list[Any]] = Field(default_factory=dict)   # version k -> steps that make it k + 1

    def fields(self) -> dict[str, FieldSpec]:
        out = {}
        for name, text in self.payload.items():
            words = str(text).split()
            optional = len(words) == 2 and words[0] == "optional"
            out[name] = FieldSpec(type=words[-1] if words else "", optional=optional)
        return out


class RuleSpec(BaseModel):
    """A named business definition; `when` an optional CEL condition Keel evaluates (keel/rules.py);
    keys besides applies_to/definition/when are parameters."""
    model_config = ConfigDict(extra="allow", frozen=True)
    applies_to: str
    definition: str
    when: str | None = None

    def params(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class MemorySpec(_Strict):
    ttl: dict[str, str] = Field(default_factory=lambda: {"tenant": "never", "task": "30d", "agent": "1d"})
    requires_evidence: list[str] = Field(default_factory=lambda: ["global", "tenant"])

    def ttl_micros(self, scope: str) -> int | None:
        return parse_duration(self.ttl.get(scope, "never"))


class HistorySpec(_Strict):
    """Where closed history lives (docs/operations.md, "Cold tier"): `cold_after` (a duration, or `never`, the
    default) is the age past which `keel archive` moves closed segments to the cold tier."""
    cold_after: str = "never"

    @field_validator("cold_after")
    @classmethod
    def _duration(cls, value: str) -> str:
        parse_duration(value)         # its ValueError names the forms
        return value

    def cold_after_micros(self) -> int | None:
        return parse_duration(self.cold_after)


class PersonalSpec(_Strict):
    """An event type's personal data (docs/privacy.md): the payload `fields` that are personal data, whose they
    are (`of`: the event's `subject`, or `payload.<field>` naming the data subject), and what reads show once
    the data subject's key is erased (`mask`, a value of each field's type)."""
    fields: list[str] = Field(min_length=1)
    of: str = "subject"
    mask: Any = "[erased]"

    def subject_field(self) -> str | None:
        """The payload field naming the data subject (None: the event's subject)."""
        return self.of.removeprefix("payload.") if self.of.startswith("payload.") else None


class SearchSpec(_Strict):
    """How `search` ranks this cartridge's entities (docs/semantics.md, "Search"): `semantic: false` leaves BM25
    alone (the model is never loaded); `synonyms`, groups of words or phrases the lexical side treats alike
    (a query holding one member also looks for the others)."""
    semantic: bool = True
    synonyms: list[list[str]] = Field(default_factory=list)

    @field_validator("synonyms")
    @classmethod
    def _groups(cls, groups: list[list[str]]) -> list[list[str]]:
        for i, group in enumerate(groups):
            if len(group) < 2 or any(not w.strip() for w in group):
                raise ValueError(f"synonyms[{i}]: give two or more non-empty words or phrases, e.g. "
                                 f"[credit card, tarjeta de crédito]")
        return groups


class CartridgeSpec(_Strict):
    name: str
    description: str = ""
    # served beside other cartridges (keel.cartridge_set), its entity types and relation names are shown as
    # `<name>.<type>` (docs/cartridges.md, "Several cartridges per tenant")
    qualified: bool = False
    entities: dict[str, EntitySpec] = Field(default_factory=dict)
    relations: dict[str, RelationSpec] = Field(default_factory=dict)
    events: dict[str, EventSpec] = Field(default_factory=dict)
    rules: dict[str, RuleSpec] = Field(default_factory=dict)
    memory: MemorySpec = Field(default_factory=MemorySpec)
    limits: Limits = Field(default_factory=Limits)
    history: HistorySpec = Field(default_factory=HistorySpec)
    search: SearchSpec = Field(default_factory=SearchSpec)
    personal: dict[str, PersonalSpec] = Field(default_factory=dict)    # event type -> its personal fields
    # `personal: {accept_clear: true}` (docs/privacy.md): personal fields that arrive in clear are accepted (a
    # migration window) instead of refused; moved here from the `personal:` mapping by `_personal_options`
    personal_accept_clear: bool = False
    # captured tables -> event types (change data capture, docs/ingress.md): checked and compiled by keel.sources
    sources: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _personal_options(cls, data: Any) -> Any:
        """`accept_clear` is an option of the `personal:` section, not an event type: taken out of it."""
        if isinstance(data, dict) and "personal_accept_clear" in data:
            raise ValueError("personal_accept_clear: unknown key (write `personal: {accept_clear: true}`)")
        personal = data.get("personal") if isinstance(data, dict) else None
        if isinstance(personal, dict) and "accept_clear" in personal:
            personal = dict(personal)
            accept = personal.pop("accept_clear")
            if not isinstance(accept, bool):
                raise ValueError(f"personal.accept_clear: {accept!r}; use true or false")
            data = {**data, "personal": personal, "personal_accept_clear": accept}
        return data
