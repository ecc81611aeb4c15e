"""What a tenant name and an entity reference look like, for every layer that meets one: the envelope checks
them (keel.envelope), the stores refuse others (keel.store.writes, the Redis key builder), the tools and the
workers check what callers and records give.

An entity reference is `<entity type>:<id>`: a type of lowercase letters, digits and _, then an id of ASCII
letters, digits and . _ @ - (first a letter or digit, at most 128 characters). A tenant is ASCII letters,
digits and . _ - (first a letter or digit, at most 64 characters).
"""
from __future__ import annotations

from .decoding import python_pattern

TENANT_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
ENTITY_ID_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._@-]{0,127}"
ENTITY_PATTERN = rf"^[a-z][a-z0-9_]*:{ENTITY_ID_PATTERN}$"
ENTITY = python_pattern(ENTITY_PATTERN)          # pydantic's patterns above, for Python's `re`
TENANT = python_pattern(TENANT_PATTERN)
