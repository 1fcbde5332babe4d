#!/usr/bin/env bash
# Run once by the postgres image on an empty data directory: the outbox table, the
# publication, and the least-privilege outboxd role, straight from ../sql.
set -euo pipefail
psql -v ON_ERROR_STOP=1 --no-psqlrc --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
  -f /outbox-sql/outbox.sql \
  -f /outbox-sql/publication.sql \
  -f /outbox-sql/role.sql
