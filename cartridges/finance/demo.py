"""The finance story (`keel demo`): one exact, auditable answer about the Visa debt, then an LLM-free agent."""

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
    expensive = rate["value"] > rule["rate_ea_pct"]
    say(f"\nRule debt_expensive: {rule['definition']}")
    say(f"  rate {rate['value']}% EA vs threshold {rule['rate_ea_pct']}% -> "
        f"{'EXPENSIVE' if expensive else 'not expensive'} (evidence {rate['evidence']})")

    say("\nDues of the Visa (related -> context on each):")
    pending = []
    for rel in tools.related(debt, "for_debt")["relations"]:
        due = tools.context(rel["subject"])
        status = fact(due, "status")["value"]
        amount = fact(due, "amount_cop")["value"]
        due_on = fact(due, "due_on")["value"]
        paid_on = fact(due, "paid_on")
        say(f"  {rel['subject']:<18} {due_on}  {cop(amount):>12}  {status}"
            + (f" on {paid_on['value']}" if paid_on else ""))
        if status == "pending":
            pending.append((rel["subject"], due_on, amount))

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
