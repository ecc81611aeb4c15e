-- The finance story written by the product, with ordinary SQL (tests/test_cdc_debezium.py runs it):
-- `keel context debt:visa --at 2026-09-15` then answers 4,200,000 from these rows.
INSERT INTO households VALUES ('hogar-demo', 'Hogar demo');
INSERT INTO creditors VALUES ('banco-andino', 'Banco Andino'), ('cooperativa-progreso', 'Cooperativa Progreso');
INSERT INTO accounts VALUES ('nomina', 'hogar-demo', 'Banco Andino');
BEGIN;
INSERT INTO debts (household_id, creditor_id, account_id, debt_key, product, month, balance_cop, rate_ea_pct,
                   installment_cop)
VALUES ('hogar-demo', 'banco-andino', 'nomina', 'visa', 'Visa', '2026-09-01', 4200000, 29.22, 380000),
       ('hogar-demo', 'cooperativa-progreso', 'nomina', 'libranza', 'Libranza', '2026-09-01', 12600000, 14.5, 520000);
INSERT INTO dues (id, household_id, debt_key, due_on, amount_cop)
VALUES ('visa-2026-09', 'hogar-demo', 'visa', '2026-09-05', 380000),
       ('libranza-2026-09', 'hogar-demo', 'libranza', '2026-09-10', 520000);
COMMIT;
BEGIN;      -- the libranza's September due is paid: a movement, a payment, the due's status
INSERT INTO movements VALUES ('mov-0910-1', 'hogar-demo', 'nomina', '2026-09-10', -520000, 'PAGO LIBRANZA');
INSERT INTO payments (due_id, movement_id, paid_on, amount_cop) VALUES ('libranza-2026-09', 'mov-0910-1', '2026-09-10', 520000);
UPDATE dues SET status = 'paid', paid_on = '2026-09-10', paid_cop = 520000, account_id = 'nomina',
                movement_id = 'mov-0910-1' WHERE id = 'libranza-2026-09';
COMMIT;
BEGIN;      -- October's snapshots
INSERT INTO debts (household_id, creditor_id, account_id, debt_key, product, month, balance_cop, rate_ea_pct,
                   installment_cop)
VALUES ('hogar-demo', 'banco-andino', 'nomina', 'visa', 'Visa', '2026-10-01', 3870000, 29.22, 380000),
       ('hogar-demo', 'cooperativa-progreso', 'nomina', 'libranza', 'Libranza', '2026-10-01', 12180000, 14.5, 520000);
COMMIT;
-- the libranza's October snapshot was wrong: the product corrects the row
UPDATE debts SET balance_cop = 12150000 WHERE debt_key = 'libranza' AND month = '2026-10-01';
-- a movement imported twice by mistake, then deleted by the next import
INSERT INTO movements VALUES ('mov-1001-dup', 'hogar-demo', 'nomina', '2026-10-01', -380000, 'PAGO VISA');
DELETE FROM movements WHERE id = 'mov-1001-dup';
