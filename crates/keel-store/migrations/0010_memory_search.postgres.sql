-- Full-text search over long-term memory (issue 15), PostgreSQL: a generated tsvector of each
-- entry's key and value (the value's JSON text) with a GIN index, ranked with ts_rank.
--
-- Words are runs of letters and digits (everything else is turned into a space first), with the
-- `simple` configuration (lower-cased, no stemming, no stop words): the same words SQLite's
-- FTS5 unicode61 tokenizer makes (0010_memory_search.sqlite.sql), so a search finds the same
-- entries on both stores.
ALTER TABLE memory ADD COLUMN search tsvector GENERATED ALWAYS AS (
    to_tsvector('simple'::regconfig, regexp_replace(key || ' ' || value, '[^[:alnum:]]+', ' ', 'g'))
) STORED;
CREATE INDEX memory_search ON memory USING GIN (search);
