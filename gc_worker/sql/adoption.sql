-- migrate_prerequisites --
-- Who migrates where, whether that role may create tables in the schema objects go to, and
-- temporary tables (adoption probes the application's CHECKs on a temporary copy).
SELECT current_user AS role_name, current_database() AS database_name,
       current_schema() AS schema_name,
       coalesce(has_schema_privilege(current_schema(), 'CREATE'), false) AS can_create,
       has_database_privilege(current_database(), 'TEMPORARY') AS can_create_temp

-- migrate_role_and_owner --
-- Who migrates, and the owner of memory-gc's tables (NULL before the first migrate).
SELECT current_user AS role_name,
       (SELECT pg_get_userbyid(relowner) FROM pg_class WHERE oid = to_regclass('gc_runs')) AS owner

-- relation_of --
-- A relation of the search path by name: its kind, owner, and whether this role may alter it.
SELECT c.relkind, pg_get_userbyid(c.relowner) AS owner, pg_has_role(c.relowner, 'USAGE') AS owned
FROM pg_class c
WHERE c.oid = to_regclass(:name)

-- columns_of --
-- A table's live columns: type as DDL writes it, NOT NULL, whether an insert may omit it,
-- whether it is generated ('s' stored, 'v' virtual) or an identity ('a' always, 'd' by
-- default), and its collation when that one is nondeterministic (NULL otherwise).
SELECT a.attname AS name, format_type(a.atttypid, a.atttypmod) AS type_name,
       t.typname AS base_type, a.attnotnull AS not_null,
       a.atthasdef OR a.attidentity <> '' OR a.attgenerated <> '' AS filled,
       a.attgenerated AS generated, a.attidentity AS identity,
       CASE WHEN NOT c.collisdeterministic THEN c.collname END AS nondeterministic
FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
LEFT JOIN pg_collation c ON c.oid = a.attcollation
WHERE a.attrelid = to_regclass(:name) AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum

-- id_is_unique --
-- Whether memories.id alone is a primary key or plain unique index (lineage references it).
SELECT EXISTS (
    SELECT 1
    FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
    WHERE i.indrelid = to_regclass('memories') AND i.indisunique AND i.indisvalid AND i.indimmediate
      AND i.indnkeyatts = 1 AND i.indpred IS NULL AND i.indexprs IS NULL AND a.attname = 'id'
)

-- lineage_keys_without_cascade --
-- Foreign keys from memory_lineage to memories that would block purging a memory.
SELECT conname FROM pg_constraint
WHERE conrelid = to_regclass('memory_lineage') AND contype = 'f'
  AND confrelid = to_regclass('memories') AND confdeltype <> 'c'
ORDER BY conname

-- invalid_indexes --
-- Indexes of the given names left invalid (a failed CREATE INDEX CONCURRENTLY).
SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
WHERE NOT i.indisvalid AND c.relname = ANY(:names)
  AND i.indrelid IN (to_regclass('memories'), to_regclass('memory_lineage'))
ORDER BY c.relname

-- row_security_hides_rows --
-- Whether row-level security could hide rows of memories from this role: a worker that sees
-- some of a user's rows (or none) would act on a part of the store as if it were all of it.
SELECT c.relrowsecurity
       AND NOT (r.rolsuper OR r.rolbypassrls)
       AND (c.relforcerowsecurity OR NOT pg_has_role(c.relowner, 'USAGE'))
FROM pg_class c, pg_roles r
WHERE c.oid = to_regclass('memories') AND r.rolname = current_user

-- keys_blocking_purge --
-- Foreign keys that may refuse a purge (every batch purging a referenced row would fail), for
-- the caller to pick: onto memories, or onto a table whose rows a purge deletes by cascade
-- (followed through every ON DELETE CASCADE key, each table once per chain; chain names the
-- tables from memories on, the shortest way): NO ACTION / RESTRICT (sets false); or SET NULL,
-- or SET DEFAULT of a column without a default, where a column it sets is NOT NULL
-- (not_null_column names it). The columns set are the key's, or those listed (SET NULL (col),
-- PostgreSQL 15+: read through to_jsonb so that older servers, without confdelsetcols, run
-- this too). memory_lineage's keys onto memories are lineage_keys_without_cascade's.
WITH RECURSIVE purged (tab, chain) AS (
    SELECT to_regclass('memories')::oid, ARRAY['memories']
    UNION ALL
    SELECT k.conrelid, p.chain || k.conrelid::regclass::text
    FROM purged p JOIN pg_constraint k ON k.confrelid = p.tab
    WHERE k.contype = 'f' AND k.confdeltype = 'c'
      AND NOT k.conrelid::regclass::text = ANY(p.chain)
)
SELECT * FROM (
    SELECT DISTINCT ON (k.oid)
           k.conrelid::regclass::text AS tab, k.conname, array_to_string(p.chain, ' → ') AS chain,
           k.confdeltype IN ('n', 'd') AS sets,
           (SELECT a.attname FROM pg_attribute a
            WHERE a.attrelid = k.conrelid AND a.attnotnull
              AND (k.confdeltype = 'n' OR NOT a.atthasdef)
              AND a.attnum = ANY(coalesce(
                      nullif(ARRAY(SELECT jsonb_array_elements_text(CASE
                                       WHEN jsonb_typeof(to_jsonb(k) -> 'confdelsetcols') = 'array'
                                       THEN to_jsonb(k) -> 'confdelsetcols' END)::int2), '{}'),
                      k.conkey))
            ORDER BY a.attnum LIMIT 1) AS not_null_column
    FROM purged p JOIN pg_constraint k ON k.confrelid = p.tab
    WHERE k.contype = 'f' AND k.confdeltype <> 'c'
      AND (k.conrelid, k.confrelid)  -- NULL-safe: the application may have no memory_lineage
          IS DISTINCT FROM (to_regclass('memory_lineage')::oid, to_regclass('memories')::oid)
    ORDER BY k.oid, cardinality(p.chain)
) keys
ORDER BY tab, conname

-- row_update_triggers --
-- BEFORE UPDATE row triggers on memories that fire on any column (no UPDATE OF list): one that
-- stamps updated_at would move the decay anchor on every worker write.
SELECT t.tgname
FROM pg_trigger t
WHERE t.tgrelid = to_regclass('memories') AND NOT t.tgisinternal AND t.tgenabled <> 'D'
  AND (t.tgtype & 1) = 1 AND (t.tgtype & 2) = 2 AND (t.tgtype & 16) = 16
  AND t.tgattr = ''::int2vector
ORDER BY 1

-- row_write_triggers --
-- BEFORE INSERT / BEFORE DELETE row triggers on memories that fire in the worker's session
-- (enabled, or ALWAYS; a REPLICA one does not fire) whose function can skip the row (RETURN
-- NULL, as a soft-delete or dedupe trigger does) or, on DELETE, refuse it (RAISE EXCEPTION):
-- the worker's purges and merged records would then fail, every night. One that fills columns
-- (a full-text search vector) skips nothing; a function whose source cannot be read (C, as
-- tsvector_update_trigger) is taken at its word. (Adoption runs before any migration: memory-
-- gc's own tombstone trigger, which the application may attach later, is not on the table yet.)
SELECT t.tgname, (t.tgtype & 4) = 4 AS on_insert, (t.tgtype & 8) = 8 AS on_delete
FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid
WHERE t.tgrelid = to_regclass('memories') AND NOT t.tgisinternal AND t.tgenabled IN ('O', 'A')
  AND (t.tgtype & 1) = 1 AND (t.tgtype & 2) = 2 AND (t.tgtype & 12) <> 0
  AND (p.prosrc ~* '\mreturn\s+null\M'
       OR ((t.tgtype & 8) = 8 AND p.prosrc ~* '\mraise\s+exception\M'))
ORDER BY 1

-- write_rules --
-- DO INSTEAD rules on memories other than a view's SELECT: an ON DELETE / INSERT / UPDATE rule
-- that replaces the worker's statements ("cannot perform DELETE RETURNING", or nothing done).
-- A DO ALSO rule (an audit log) adds a statement and leaves the worker's as it was.
SELECT r.rulename, CASE r.ev_type WHEN '2' THEN 'UPDATE' WHEN '3' THEN 'INSERT'
                                   ELSE 'DELETE' END AS event
FROM pg_rewrite r
WHERE r.ev_class = to_regclass('memories') AND r.ev_type <> '1' AND r.ev_enabled <> 'D'
  AND r.is_instead
ORDER BY 1

-- foreign_checks --
-- The application's CHECK constraints on memories, each with its definition and whether it
-- reads a column the worker updates (a status change keeps every other column as it was, so
-- only those can refuse one; a record the worker inserts can meet any of them).
SELECT c.conname, pg_get_constraintdef(c.oid) AS definition,
       EXISTS (SELECT 1 FROM pg_attribute a
               WHERE a.attrelid = c.conrelid AND a.attnum = ANY(c.conkey)
                 AND a.attname IN ('status', 'status_reason', 'source', 'memory_type',
                                   'importance', 'confidence', 'decayed_confidence',
                                   'superseded_by', 'deleted_at', 'valid_until',
                                   'status_changed_at', 'importance_assessed_at'))
         AS on_updated_columns
FROM pg_constraint c
WHERE c.conrelid = to_regclass('memories') AND c.contype = 'c'
ORDER BY 1

-- colliding_unique_indexes --
-- The application's unique indexes and exclusion constraints on memories (with the constraint
-- an index backs, if any: it is dropped as a constraint) that a record the worker inserts can
-- violate:
-- not keyed on id (a merged record has a new one), and reading only contract columns — in
-- keys, expressions and predicate alike — which a merged record copies from a member that
-- still exists (retired, not deleted); or NULLS NOT DISTINCT (its columns of the
-- application's are NULL in every merged record).
SELECT c.relname AS index_name, pg_get_indexdef(i.indexrelid) AS definition,
       i.indisexclusion AS exclusion,
       (SELECT k.conname FROM pg_constraint k
        WHERE k.conindid = i.indexrelid AND k.conrelid = i.indrelid
          AND k.contype IN ('u', 'x')) AS constraint_name
FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
WHERE i.indrelid = to_regclass('memories') AND (i.indisunique OR i.indisexclusion)
  AND NOT EXISTS (SELECT 1 FROM pg_attribute a
                  WHERE a.attrelid = i.indrelid AND a.attname = 'id'
                    AND a.attnum = ANY((i.indkey::int2[])[0:i.indnkeyatts - 1]))
  AND (pg_get_indexdef(i.indexrelid) LIKE '%NULLS NOT DISTINCT%'
       OR NOT EXISTS (
           SELECT 1 FROM pg_attribute a
           WHERE a.attrelid = i.indrelid AND a.attnum > 0
             AND NOT a.attname = ANY(CAST(:contract AS name[]))
             AND (a.attnum = ANY((i.indkey::int2[])[0:i.indnkeyatts - 1])
                  OR EXISTS (SELECT 1 FROM pg_depend d
                             WHERE d.classid = 'pg_class'::regclass AND d.objid = i.indexrelid
                               AND d.refclassid = 'pg_class'::regclass
                               AND d.refobjid = i.indrelid AND d.refobjsubid = a.attnum))))
ORDER BY 1

-- misplaced_indexes --
-- Indexes of memory-gc's names on some other table: migrate would take them for its own.
SELECT c.relname AS index_name, i.indrelid::regclass::text AS table_name
FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
WHERE c.relname = ANY(:names)
  AND i.indrelid NOT IN (coalesce(to_regclass('memories'), 0), coalesce(to_regclass('memory_lineage'), 0))
  AND c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema())
ORDER BY 1

-- schemas_of_the_store --
-- Where memories is (NULL: not yet), where pgvector is installed and whether its type is visible.
SELECT (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE c.oid = to_regclass('memories')) AS memories_schema,
       (SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
        WHERE e.extname = 'vector') AS vector_schema,
       to_regtype('vector') IS NOT NULL AS vector_visible

-- probe_sequence_defaults --
-- Columns of adoption's probe table whose default draws from a sequence.
SELECT a.attname
FROM pg_attrdef d JOIN pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum
WHERE d.adrelid = to_regclass('pg_temp.memory_gc_probe')
  AND pg_get_expr(d.adbin, d.adrelid) LIKE '%nextval(%'

-- column_defaults --
-- The defaults of memories' columns of the given names (a column without one, or generated:
-- no row; DEFAULT NULL stores none).
SELECT a.attname AS name, pg_get_expr(d.adbin, d.adrelid) AS expression
FROM pg_attrdef d JOIN pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum
WHERE d.adrelid = to_regclass('memories') AND NOT a.attisdropped AND a.attgenerated = ''
  AND a.attname = ANY(:names)
ORDER BY a.attnum

-- contract_check_definitions --
-- The definitions of the CHECKs of the given names on memories and on adoption's copy of its
-- columns (pg_temp.memory_gc_contract), as PostgreSQL prints them: an application's CHECK of
-- one of migrate's names is kept in place of migrate's, so it must say the same.
SELECT c.conname, pg_get_constraintdef(c.oid) AS definition,
       c.conrelid = to_regclass('memories') AS theirs, c.convalidated AS validated
FROM pg_constraint c
WHERE c.conrelid IN (to_regclass('memories'), to_regclass('pg_temp.memory_gc_contract'))
  AND c.contype = 'c' AND c.conname = ANY(:names)

-- clashing_names --
-- Objects of the given names in the schema memory-gc creates its own in (the first of the
-- search_path): a relation (table, view, index, sequence), a function, or a type of its own.
SELECT o.kind, o.name FROM (
    SELECT CASE c.relkind WHEN 'i' THEN 'index' WHEN 'I' THEN 'index' WHEN 'S' THEN 'sequence'
                          WHEN 'v' THEN 'view' WHEN 'm' THEN 'materialized view'
                          ELSE 'table' END AS kind, c.relname::text AS name
    FROM pg_class c WHERE c.relnamespace = to_regnamespace(current_schema())
      AND c.relname = ANY(:names)
    UNION
    SELECT 'function', p.proname::text FROM pg_proc p
    WHERE p.pronamespace = to_regnamespace(current_schema()) AND p.proname = ANY(:names)
    UNION
    SELECT 'type', t.typname::text FROM pg_type t
    WHERE t.typnamespace = to_regnamespace(current_schema()) AND t.typname = ANY(:names)
      AND t.typrelid = 0
) o
ORDER BY o.name, o.kind
