//! The database's tables, as numbered migrations applied at start-up under an advisory lock (so
//! that processes starting at once apply each one once), and the refusal to run on a schema
//! newer than this server knows: a newer server may have changed what a row means.

use tokio_postgres::Client;

/// The advisory lock every process takes while it brings the schema up to date ("smolmcp1").
const MIGRATION_LOCK: i64 = 0x736d_6f6c_6d63_7031;

/// The database's clock in milliseconds: every time compared between processes (heartbeats,
/// ages) is the database's, so that hosts whose clocks disagree still agree on who is dead.
pub(super) const NOW_MS: &str = "(extract(epoch from clock_timestamp()) * 1000)::bigint";

/// Each migration once, in order; the schema's version is the number applied. Never edit one
/// that has shipped: add the next.
pub(super) const MIGRATIONS: &[&str] = &[
    // 1: every kind of record the SQLite file keeps, owned by an instance (a process
    // registered with its heartbeat) rather than by a pid, which names nothing on another host.
    "
    CREATE TABLE instances (
        id TEXT PRIMARY KEY,
        slot INTEGER NOT NULL,
        host TEXT NOT NULL,
        pid BIGINT NOT NULL,
        pid_started BIGINT,
        started_ms BIGINT NOT NULL,
        heartbeat_ms BIGINT NOT NULL
    );
    CREATE SEQUENCE instance_slots;
    CREATE TABLE runs (
        id BIGINT PRIMARY KEY,
        owner TEXT NOT NULL,
        pid BIGINT NOT NULL,
        tool TEXT NOT NULL,
        fleet TEXT NOT NULL,
        machine TEXT NOT NULL,
        command_kind TEXT NOT NULL,
        command TEXT NOT NULL,
        workdir TEXT,
        env_names TEXT NOT NULL,
        started_ms BIGINT NOT NULL,
        ended_ms BIGINT,
        outcome TEXT NOT NULL,
        exit_code INTEGER,
        timed_out BOOLEAN,
        error TEXT,
        stdout_bytes BIGINT,
        stdout_dropped BIGINT,
        stdout_head TEXT,
        stdout_tail TEXT,
        stderr_bytes BIGINT,
        stderr_dropped BIGINT,
        stderr_head TEXT,
        stderr_tail TEXT,
        usage TEXT
    );
    CREATE INDEX runs_started ON runs (started_ms);
    CREATE INDEX runs_open ON runs (owner) WHERE outcome = 'running';
    CREATE TABLE jobs (
        id TEXT PRIMARY KEY,
        run_id BIGINT,
        owner TEXT NOT NULL,
        pid BIGINT NOT NULL,
        fleet TEXT NOT NULL,
        engine TEXT NOT NULL,
        machine TEXT NOT NULL,
        command TEXT NOT NULL,
        base TEXT NOT NULL,
        started_ms BIGINT NOT NULL,
        timeout_secs BIGINT NOT NULL,
        state TEXT NOT NULL,
        exit_code INTEGER,
        reason TEXT,
        ended_ms BIGINT
    );
    CREATE INDEX jobs_running ON jobs (owner) WHERE state = 'running';
    CREATE TABLE egress_grants (
        id BIGSERIAL PRIMARY KEY,
        machine TEXT NOT NULL,
        fleet TEXT NOT NULL,
        engine TEXT NOT NULL,
        destination TEXT NOT NULL,
        granted_ms BIGINT NOT NULL
    );
    CREATE INDEX egress_grants_machine ON egress_grants (machine, fleet);
    CREATE TABLE tasks (
        id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        pid BIGINT NOT NULL,
        tool TEXT NOT NULL,
        created_ms BIGINT NOT NULL,
        ttl_ms BIGINT NOT NULL,
        outcome TEXT
    );
    CREATE TABLE spend_days (
        day TEXT PRIMARY KEY,
        period_total_micros BIGINT NOT NULL
    );
    CREATE TABLE idempotency_keys (
        key TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        pid BIGINT NOT NULL,
        pid_started BIGINT,
        tool TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        arguments TEXT NOT NULL,
        started_ms BIGINT NOT NULL,
        answer TEXT,
        answer_dropped BOOLEAN NOT NULL DEFAULT false
    );
    ",
    // 2: the documents the processes share as the processes of one host share files of the
    // runtime directory: the record of ephemeral machines and their leases (process::ephemeral)
    // and which machines were made with which credential bindings and egress asks
    // (process::credentials). Each is read and written whole under its row's lock, as a file
    // is under its lock, so that a claim is made once.
    "
    CREATE TABLE documents (
        name TEXT PRIMARY KEY,
        body TEXT NOT NULL
    );
    ",
    // 3: what every process must agree on to answer for another: the key MCP requestStates
    // are sealed with (written by the first process that starts, random), and the states
    // already answered (each taken once by any process).
    "
    CREATE TABLE server_secrets (
        name TEXT PRIMARY KEY,
        value BYTEA NOT NULL
    );
    CREATE TABLE taken_states (
        nonce TEXT PRIMARY KEY,
        taken_ms BIGINT NOT NULL
    );
    ",
    // 4: a task answered by any process: who may see it, how it stands (its result once
    // completed), and whether another process was asked to cancel it.
    "
    ALTER TABLE tasks ADD COLUMN client TEXT NOT NULL DEFAULT '';
    ALTER TABLE tasks ADD COLUMN detail TEXT;
    ALTER TABLE tasks ADD COLUMN cancel_asked BOOLEAN NOT NULL DEFAULT false;
    ",
    // 5: each user's own (OAuth sign-in): runs and jobs carry who made them (what was there
    // is the operator's, the empty id), machines whose maker was signed in are held by that
    // user (a row for each word a tool may name it by: its name, and on cloud its id, each
    // naming the machine), and what a user's deleted cloud machines cost is kept by day.
    "
    ALTER TABLE runs ADD COLUMN user_id TEXT NOT NULL DEFAULT '';
    ALTER TABLE jobs ADD COLUMN user_id TEXT NOT NULL DEFAULT '';
    ALTER TABLE egress_grants ADD COLUMN user_id TEXT NOT NULL DEFAULT '';
    CREATE INDEX runs_user ON runs (user_id, id);
    CREATE TABLE machine_owners (
        fleet TEXT NOT NULL,
        name TEXT NOT NULL,
        machine TEXT NOT NULL,
        user_id TEXT NOT NULL,
        made_ms BIGINT NOT NULL,
        PRIMARY KEY (fleet, name)
    );
    CREATE INDEX machine_owners_user ON machine_owners (user_id);
    CREATE TABLE user_spend (
        user_id TEXT NOT NULL,
        day TEXT NOT NULL,
        settled_micros BIGINT NOT NULL,
        PRIMARY KEY (user_id, day)
    );
    ",
    // 6: a machine's name is claimed before the machine is made and held as made once it
    // is: a claim in the making gives no call the machine (what was held before was made).
    "
    ALTER TABLE machine_owners ADD COLUMN made BOOLEAN NOT NULL DEFAULT true;
    ",
    // 7: a taken state names whose it was, so that the states taken are bounded per user as
    // well as in all (what was taken before is the operator's).
    "
    ALTER TABLE taken_states ADD COLUMN user_id TEXT NOT NULL DEFAULT '';
    CREATE INDEX taken_states_user ON taken_states (user_id);
    ",
    // 8: the record of ephemeral machines as a row per machine, out of its document: every
    // create and delete rewrote the one document under its row's lock, so the processes
    // sharing the database took turns on every call. A change now locks the rows of the
    // machines it names (and a lock per name, for a machine not yet recorded); a change of
    // the whole record (a sweep's claim, a count of bases) locks the table. `seq` keeps the
    // order machines were recorded in. A document that is not a valid record stops the
    // migration, as it stopped every change of it before, saying how to reset it.
    "
    CREATE TABLE ephemeral_machines (
        seq BIGSERIAL NOT NULL,
        fleet TEXT NOT NULL,
        name TEXT NOT NULL,
        id TEXT NOT NULL,
        body JSONB NOT NULL,
        PRIMARY KEY (fleet, name)
    );
    CREATE INDEX ephemeral_machines_id ON ephemeral_machines (id);
    DO $$
    BEGIN
        INSERT INTO ephemeral_machines (fleet, name, id, body)
        SELECT e->>'fleet', e->>'name', e->>'id', e
        FROM documents d, jsonb_array_elements(d.body::jsonb) WITH ORDINALITY AS x(e, i)
        WHERE d.name = 'ephemeral-machines' AND d.body <> ''
        ORDER BY i
        ON CONFLICT (fleet, name) DO NOTHING;
    EXCEPTION WHEN OTHERS THEN
        RAISE EXCEPTION 'the shared document ephemeral-machines is not a valid machine record \
(%). Machines this server created may still be running: list them, delete what is not \
needed, then reset the record (DELETE FROM documents WHERE name = ''ephemeral-machines'')', \
SQLERRM;
    END $$;
    DELETE FROM documents WHERE name = 'ephemeral-machines';
    ",
];

/// Why the database cannot be used as this server's store.
#[derive(Debug, thiserror::Error)]
pub(super) enum SchemaError {
    #[error(
        "its schema is version {found}, newer than this server knows (up to {known}): a newer \
         smol-mcp has used this database; run that release, or give this one a database of its own"
    )]
    Newer { found: i32, known: usize },
    #[error("bringing its schema up to version {version} failed: {}", super::connection::said(.source))]
    Migration {
        version: usize,
        source: tokio_postgres::Error,
    },
    #[error("{}", super::connection::said(.0))]
    Database(#[from] tokio_postgres::Error),
}

/// Brings the schema up to the newest migration, one process at a time; answers the version.
pub(super) async fn migrate(client: &mut Client) -> Result<usize, SchemaError> {
    let transaction = client.transaction().await?;
    transaction
        .execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await?;
    transaction
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS smol_mcp_schema (
                version INTEGER PRIMARY KEY,
                applied_ms BIGINT NOT NULL
            )",
        )
        .await?;
    let found: i32 = transaction
        .query_one("SELECT COALESCE(MAX(version), 0) FROM smol_mcp_schema", &[])
        .await?
        .get(0);
    let known = MIGRATIONS.len();
    let found_at = usize::try_from(found).unwrap_or(0);
    if found_at > known {
        return Err(SchemaError::Newer { found, known });
    }
    for (index, migration) in MIGRATIONS.iter().enumerate().skip(found_at) {
        let version = index + 1;
        transaction
            .batch_execute(migration)
            .await
            .map_err(|source| SchemaError::Migration { version, source })?;
        let number = i32::try_from(version).unwrap_or(i32::MAX);
        transaction
            .execute(
                &format!("INSERT INTO smol_mcp_schema (version, applied_ms) VALUES ($1, {NOW_MS})"),
                &[&number],
            )
            .await?;
    }
    transaction.commit().await?;
    Ok(known)
}
