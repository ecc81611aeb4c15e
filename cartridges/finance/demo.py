"""The finance story (`keel demo`): one exact, auditable answer about the Visa debt, then an LLM-free agent."""

import json

TENANT = "hogar-demo"


def cop(n):
    return f"{n:,.0f} COP"


def fact(context, predicate):
    return next((f for f in context["facts"] if f["predicate"] == predicate and f["scope"] is None), None)


def run(ctx):
    say = ctx.say
    tools = ctx.tools(TENANT, agent="debts", task="visa-plan")
    say(f"Keel demo: {ctx.applied} events of {TENANT} projected into the embedded graph.\n")
    say('Q: "How much do we owe on the Visa now, and what did we owe on 15 September?"')
    hit = tools.search("Visa", type="debt")["results"][0]
    debt = hit["entity"]
    now = tools.context(debt)
    then = tools.context(debt, at="2026-09-15")
    b_now, b_then = fact(now, "balance_cop"), fact(then, "balance_cop")
    say(f"  search 'Visa'        -> {debt} ({hit['labels']['creditor']}, {hit['labels']['product']})")
    say(f"  balance now          = {cop(b_now['value'])}  (evidence {b_now['evidence']}, "
        f"valid from {b_now['valid_from'][:10]})")
    say(f"  balance on 2026-09-15 = {cop(b_then['value'])}  (evidence {b_then['evidence']}, "
        f"valid {b_then['valid_from'][:10]} -> {b_then['valid_to'][:10]})")

    rule = now["rules"]["debt_expensive"]
    rate = fact(now, "rate_ea_pct")
    expensive = rule["holds"]
    say('\nQ: "Is the Visa expensive by the cartridge\'s rule?"  (Keel evaluates the rule; no agent compares)')
    say(f"  rule debt_expensive: {rule['definition']}")
    say(f"  when {rule['when']}  (rate_ea_pct={rule['rate_ea_pct']})")
    say(f"  verdict: holds={json.dumps(rule['holds'])}  because {', '.join(rule['because'])} "
        f"(rate {rate['value']}% EA)   -- known through {now['known_through']}")

    say("\nDues of the Visa (related -> context on each), and Keel's due_overdue verdict today:")
    pending = []
    for rel in tools.related(debt, "for_debt")["relations"]:
        due = tools.context(rel["subject"])
        status = fact(due, "status")["value"]
        amount = fact(due, "amount_cop")["value"]
        due_on = fact(due, "due_on")["value"]
        paid_on = fact(due, "paid_on")
        overdue = due["rules"]["due_overdue"]["holds"]
        say(f"  {rel['subject']:<18} {due_on}  {cop(amount):>12}  {status}"
            + (f" on {paid_on['value']}" if paid_on else "") + ("  OVERDUE" if overdue else ""))
        if status == "pending":
            pending.append((rel["subject"], due_on, amount))
    if pending:
        subject = pending[0][0]
        say(f"\nQ: \"Is {subject} overdue?\" depends on when you ask (context with at):")
        for at in ("2026-11-05", "2026-11-06"):
            verdict = tools.context(subject, at=at)["rules"]["due_overdue"]
            say(f"  at {at}: holds={json.dumps(verdict['holds'])}  because {', '.join(verdict['because'])}")

    say("\nThe agent (no LLM): related -> context -> rule -> annotate, in task scope, citing the rate fact.")
    if expensive and pending:
        subject, due_on, amount = pending[0]
        advice = (f"Pay {subject} ({cop(amount)}, due {due_on}) first and prepay the Visa: "
                  f"{rate['value']}% EA is above the {rule['rate_ea_pct']}% line.")
        note = tools.annotate(debt, "next_step", advice, "task", evidence=rate["evidence"])["fact"]
        say(f"  annotate -> {note['predicate']} (scope {note['scope']}, by {note['by']}, "
            f"evidence {note['evidence']}, expires {note['expires_at'][:10]})")
        say(f"             \"{note['value']}\"")

    say("\nHistory of the Visa balance and notes (every version, closed ones included):")
    for v in tools.history(debt)["versions"]:
        if v["predicate"] in ("balance_cop", "next_step"):
            to = v["valid_to"][:10] if v["valid_to"] else "open"
            say(f"  {v['predicate']}={v['value']} valid {v['valid_from'][:10]} -> {to}  (evidence {v['evidence']})")
    say("\nTry it yourself: keel context cartridges/finance cartridges/finance/events.jsonl debt:visa --at 2026-09-15")
