-- stockade schema, version 6: the SKUs of a purchase-limit group by their group.
--
-- set_purchase_limit deletes the group's SKUs that its new list leaves out, and
-- remove_purchase_limit's delete of the group cascades to its SKUs: both find them by
-- group_name, which no index covered, so each scanned the whole table (the plan audit in
-- tests/python/test_plans.py found it). The table is small in most deployments; this
-- keeps each call proportional to its group wherever it is not.
--
-- On a large database, CREATE INDEX here takes a SHARE lock on the table while it builds
-- (set_purchase_limit waits, reservations do not). To avoid even that, build it first with
-- CREATE INDEX CONCURRENTLY under this name; IF NOT EXISTS then skips it.

CREATE INDEX IF NOT EXISTS purchase_limit_sku_group ON {{schema}}.purchase_limit_sku (group_name);
