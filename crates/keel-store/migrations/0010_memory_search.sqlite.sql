-- Full-text search over long-term memory (issue 15), SQLite: an FTS5 index of each entry's key
-- and value (the value's JSON text), kept by triggers, ranked with BM25.
--
-- The index is external-content (it stores no copy of the text): its rowids are memory's, so
-- memory gets an explicit INTEGER PRIMARY KEY (id) that VACUUM never renumbers — the table is
-- rebuilt with it, keeping (tenant_id, namespace, key) unique. Tokenizer: unicode61 without
-- diacritic removal (letters and digits make words, case folded), the same words PostgreSQL's
-- index sees (0010_memory_search.postgres.sql).
CREATE TABLE memory_v10 (
    id         INTEGER PRIMARY KEY,
    tenant_id  TEXT   NOT NULL,
    namespace  TEXT   NOT NULL,
    key        TEXT   NOT NULL,
    value      TEXT   NOT NULL,
    updated_at BIGINT NOT NULL,
    UNIQUE (tenant_id, namespace, key)
);
INSERT INTO memory_v10 (tenant_id, namespace, key, value, updated_at)
    SELECT tenant_id, namespace, key, value, updated_at FROM memory;
DROP TABLE memory;
ALTER TABLE memory_v10 RENAME TO memory;

CREATE VIRTUAL TABLE memory_fts USING fts5(
    key, value, content='memory', content_rowid='id', tokenize='unicode61 remove_diacritics 0'
);
INSERT INTO memory_fts (memory_fts) VALUES ('rebuild');

CREATE TRIGGER memory_fts_insert AFTER INSERT ON memory BEGIN
    INSERT INTO memory_fts (rowid, key, value) VALUES (new.id, new.key, new.value);
END;
CREATE TRIGGER memory_fts_delete AFTER DELETE ON memory BEGIN
    INSERT INTO memory_fts (memory_fts, rowid, key, value) VALUES ('delete', old.id, old.key, old.value);
END;
CREATE TRIGGER memory_fts_update AFTER UPDATE ON memory BEGIN
    INSERT INTO memory_fts (memory_fts, rowid, key, value) VALUES ('delete', old.id, old.key, old.value);
    INSERT INTO memory_fts (rowid, key, value) VALUES (new.id, new.key, new.value);
END;
