-- The household-finance product's own tables, as the product has them (no outbox, no events): Keel reads their
-- changes through Debezium (docs/ingress.md); cartridge.yaml's `sources:` maps them to the catalog.
CREATE TABLE IF NOT EXISTS households (
    id          text PRIMARY KEY,                 -- also Keel's tenant
    name        text NOT NULL
);
CREATE TABLE IF NOT EXISTS creditors (
    id          text PRIMARY KEY,
    name        text NOT NULL
);
CREATE TABLE IF NOT EXISTS accounts (
    id          text PRIMARY KEY,
    household_id text NOT NULL REFERENCES households(id),
    bank        text NOT NULL
);
-- one snapshot row per debt and month, with three foreign keys
CREATE TABLE IF NOT EXISTS debts (
    id              bigserial PRIMARY KEY,
    household_id    text NOT NULL REFERENCES households(id),
    creditor_id     text NOT NULL REFERENCES creditors(id),
    account_id      text REFERENCES accounts(id),   -- the account its dues are debited from
    debt_key        text NOT NULL,                  -- the product's stable name of the debt (visa, libranza)
    product         text NOT NULL,
    month           date NOT NULL,                  -- the first day of the month the snapshot is of
    balance_cop     numeric(16, 2) NOT NULL,
    rate_ea_pct     numeric(6, 2) NOT NULL,
    installment_cop numeric(16, 2) NOT NULL,
    UNIQUE (household_id, debt_key, month)
);
-- the due calendar: paying a due sets status, paid_on, paid_cop, account_id and movement_id
CREATE TABLE IF NOT EXISTS dues (
    id           text PRIMARY KEY,                  -- visa-2026-09
    household_id text NOT NULL REFERENCES households(id),
    debt_key     text NOT NULL,
    due_on       date NOT NULL,
    amount_cop   numeric(16, 2) NOT NULL,
    status       text NOT NULL DEFAULT 'pending',
    paid_on      date,
    paid_cop     numeric(16, 2),
    account_id   text REFERENCES accounts(id),
    movement_id  text
);
-- bank movements imported from statements
CREATE TABLE IF NOT EXISTS movements (
    id           text PRIMARY KEY,
    household_id text NOT NULL REFERENCES households(id),
    account_id   text NOT NULL REFERENCES accounts(id),
    booked_on    date NOT NULL,
    amount_cop   numeric(16, 2) NOT NULL,
    description  text NOT NULL DEFAULT ''
);
-- payments as the product records them (not mapped: a payment shows in Keel through its due's update)
CREATE TABLE IF NOT EXISTS payments (
    id           bigserial PRIMARY KEY,
    due_id       text NOT NULL REFERENCES dues(id),
    movement_id  text NOT NULL,
    paid_on      date NOT NULL,
    amount_cop   numeric(16, 2) NOT NULL
);
