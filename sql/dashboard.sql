-- amqpscope dashboard queries (Databricks SQL; any engine that reads Delta by path works alike).
-- Replace /Volumes/main/amqpscope/lake by the bundle's lake_path. Each query is one dashboard tile.
-- Only complete captures are shown: those whose derive finished on their latest ingest (runs table,
-- docs/TABLES.md); a capture still being processed, or whose run was killed, is left out until a run
-- completes it.

-- Complete captures: the view every tile below starts from.
CREATE OR REPLACE TEMPORARY VIEW complete_captures AS
SELECT d.capture_id, d.ended AS derived_at
FROM delta.`/Volumes/main/amqpscope/lake/runs` AS d
LEFT JOIN delta.`/Volumes/main/amqpscope/lake/runs` AS i
  ON i.capture_id = d.capture_id AND i.stage = 'ingest'
WHERE d.stage = 'derive' AND d.outcome = 'ok'
  AND (i.capture_id IS NULL OR (i.outcome = 'ok' AND d.source_run = i.run_id));

-- Tile "Captures not (yet) complete": what the job still has to do, or failed to.
SELECT r.capture_id, r.stage, r.outcome, r.started, r.ended
FROM delta.`/Volumes/main/amqpscope/lake/runs` AS r
LEFT ANTI JOIN complete_captures AS c ON c.capture_id = r.capture_id
ORDER BY r.started DESC;

-- Tile "Bottleneck per capture": the diagnosis headline, newest captures first.
SELECT c.derived_at, k.file_name, k.first_ts, k.last_ts,
       g.bottleneck, g.effect, g.entity_kind, g.entity, g.findings_count, g.headline
FROM complete_captures AS c
JOIN delta.`/Volumes/main/amqpscope/lake/diagnosis` AS g USING (capture_id)
JOIN delta.`/Volumes/main/amqpscope/lake/captures` AS k USING (capture_id)
ORDER BY k.last_ts DESC;

-- Tile "Bottlenecks by component" (bar chart): how often each stage of the path held traffic back.
SELECT g.bottleneck, count(*) AS captures
FROM complete_captures AS c
JOIN delta.`/Volumes/main/amqpscope/lake/diagnosis` AS g USING (capture_id)
GROUP BY g.bottleneck
ORDER BY captures DESC;

-- Tile "Data quality": decoded share, gaps, rule violations and suite results per capture.
SELECT q.run_ts, q.file_name, q.packets, q.amqp_connections, q.frames,
       round(100.0 * q.framed_bytes / nullif(q.payload_bytes, 0), 2) AS framed_percent,
       q.quarantined_bytes, q.missing_bytes, q.gaps, q.bytes_accounted,
       q.violations_error, q.violations_warning, q.violations_capture,
       q.suites_passed, q.suites_failed, q.bottleneck
FROM complete_captures AS c
JOIN delta.`/Volumes/main/amqpscope/lake/dq_summary` AS q USING (capture_id)
ORDER BY q.run_ts DESC;

-- Tile "Rule violations by rule" over the complete captures.
SELECT v.rule_id, v.severity, count(*) AS violations, count(DISTINCT v.capture_id) AS captures
FROM complete_captures AS c
JOIN delta.`/Volumes/main/amqpscope/lake/violations` AS v USING (capture_id)
GROUP BY v.rule_id, v.severity
ORDER BY violations DESC;
