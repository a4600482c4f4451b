"""The Redis ACL user of each tenant the operator lists (EVALQ_TENANTS): it may write only its own
request queue (kombu's priority lists and binding of it too) and read only its own reply lists
(``replies:<tenant>:*``). ``evalq tenants acl`` prints the lines, or applies them to the broker.

On Redis 7 and later the reply lists are a selector of their own, ``(~replies:<tenant>:* +blpop
+lpop +llen)``: the user may pop its answers and push nothing there (issue 70: with one flat rule
set, the LPUSH a request needs was allowed on the reply lists too, and a tenant filled the broker's
memory with 32 MiB in 0.4 s that never expired). Redis 6 has no selectors: there the flat rules
stand, and the cluster bounds a reply list (trimmed, and expiring) each time it answers on it."""

from __future__ import annotations

import os
import re

# what kombu's publish needs (LPUSH inside MULTI, LLEN of the priority lists, SADD of the binding),
# what a pipeline's wait on its replies needs, and the connection's own commands. Nothing more: no
# SELECT (the user stays on database 0, where the cluster's queues are: Redis's ACLs cannot limit
# the databases a user may push in, only whether it may change), no INFO (key counts, clients,
# memory: what every tenant does), no CLIENT (names, lists, kills). ioredis (celery-node) asks INFO
# for its ready check and goes on without it, saying so; `enableReadyCheck: false` quiets it.
COMMANDS = ("+lpush", "+sadd", "+multi", "+exec", "+llen", "+blpop", "+lpop", "+ping", "+hello", "+auth")
PUBLISH = ("+lpush", "+sadd", "+multi", "+exec", "+llen", "+ping", "+hello", "+auth")  # the root's, with a selector
REPLIES = ("+blpop", "+lpop", "+llen")  # the reply lists' selector: popped, never pushed


def password_env(tenant: str) -> str:
    """The variable holding a tenant's Redis password: EVALQ_TENANT_PASSWORD_<TENANT>."""
    return "EVALQ_TENANT_PASSWORD_" + re.sub(r"[^A-Za-z0-9]", "_", tenant).upper()


def rules(tenant: str, password: str, selectors: bool = True) -> list[str]:
    """The ACL SETUSER arguments of ``tenant`` (after the user name); ``selectors``: the reply lists
    as a selector of their own (Redis 7 and later), else the flat form Redis 6 takes."""
    queue = f"evalq.jobs.{tenant}"
    publish = ["reset", "on", f">{password}", f"~{queue}", f"~{queue}\x06\x16*", f"~_kombu.binding*.{queue}"]
    if not selectors:
        return [*publish, f"~replies:{tenant}:*", "resetchannels", "-@all", *COMMANDS]
    return [*publish, "resetchannels", "-@all", *PUBLISH, f"(~replies:{tenant}:* {' '.join(REPLIES)})"]


def has_selectors(version: str) -> bool:
    """Whether a Redis of ``version`` (its INFO's ``redis_version``) takes ACL selectors (7.0 and later)."""
    try:
        return int(str(version).split(".")[0]) >= 7
    except ValueError:
        return False


def tenant_users(tenants: list[str], environ=os.environ, selectors: bool = True) -> tuple[dict[str, list[str]], list[str]]:
    """(tenant -> its ACL rules, the password variables that are not set) for ``tenants``
    (the default tenant has no user of its own: it is the shared evalq.jobs)."""
    users, missing = {}, []
    for tenant in tenants:
        if tenant == "default":
            continue
        password = environ.get(password_env(tenant))
        if not password:
            missing.append(password_env(tenant))
        else:
            users[tenant] = rules(tenant, password, selectors)
    return users, missing


def acl_line(tenant: str, rules_: list[str], hide: bool = True) -> str:
    """One line of an ACL file (Redis's own quoting; the \\x06\\x16 of kombu's priority lists
    escaped), the password shown as ``>***`` unless ``hide`` is False."""
    def quote(arg: str) -> str:
        if arg.startswith(">") and hide:
            return ">***"
        if "\x06" in arg:
            return '"' + arg.replace("\x06", "\\x06").replace("\x16", "\\x16") + '"'
        return arg

    return " ".join(["user", tenant, *(quote(a) for a in rules_)])
