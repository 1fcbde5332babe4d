// The inbox protocol of docs/inbox.md in Go (franz-go + pgx): reads outboxd's account
// events and keeps balances and a ledger in its own PostgreSQL database, each event applied
// once and in order per account, through crashes and rebalances. The same program as
// crates/inbox/src/bin/inbox-example.rs, to copy.
//
//	INBOX_DATABASE_URL=postgresql://ledger@db/ledger INBOX_BOOTSTRAP_SERVERS=kafka:9092 \
//	INBOX_TOPICS=outbox.account go run .
//
// | variable | meaning |
// |---|---|
// | INBOX_DATABASE_URL | the consumer's database (libpq key=value or URL); sql/inbox.sql installed in it |
// | INBOX_BOOTSTRAP_SERVERS | Kafka |
// | INBOX_TOPICS | comma-separated topics |
// | INBOX_GROUP | consumer group and inbox name, default balances |
// | INBOX_KAFKA_CONFIG | session.timeout.ms, heartbeat.interval.ms, auto.commit.interval.ms (default 5000): name=value,... |
// | INBOX_KEEP_KEYS_HOURS | dedup key retention, default 336 (14 days); 0: keep all |
// | INBOX_INSTANCE | this process's name in the ledger, default pid-<pid> |
//
// Each event's payload is {"amount": <integer>}, its record key the account. It prints one
// line per event; it exits 1 on an error (a supervisor restarts it, and the group's
// committed offsets re-deliver what was not committed, which the inbox skips), 2 on a bad
// setting, 0 after SIGTERM (leaving the group, its offsets committed).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

const tables = `
CREATE TABLE IF NOT EXISTS balances (
    account text   PRIMARY KEY,
    balance bigint NOT NULL
);
CREATE TABLE IF NOT EXISTS ledger (
    seq       bigserial PRIMARY KEY,
    account   text      NOT NULL,
    version   bigint    NULL,
    event_key text      NOT NULL,
    amount    bigint    NOT NULL,
    applied_by text     NOT NULL  -- INBOX_INSTANCE: which process applied it
)`

const maxHeld = 10_000

type settings struct {
	database, bootstrap, group, instance string
	topics                               []string
	session, heartbeat, commitEvery      time.Duration
	keepHours                            int
}

// event is what the inbox needs of a record (docs/inbox.md, "What a record carries").
type event struct {
	key, eventID, aggregateType string
	aggregateID                 *string
	version                     *int64
	topic                       string
	partition                   int32
	offset                      int64
	payload                     []byte
}

func (e *event) where() string {
	id, v := "-", "-"
	if e.aggregateID != nil {
		id = *e.aggregateID
	}
	if e.version != nil {
		v = strconv.FormatInt(*e.version, 10)
	}
	return fmt.Sprintf("%s/%d@%d %s v%s key=%s", e.topic, e.partition, e.offset, id, v, e.key)
}

func readEvent(r *kgo.Record) (*event, error) {
	headers := map[string]string{}
	// The last header of a name wins: outboxd's own come after the row's.
	for _, h := range r.Headers {
		headers[h.Key] = string(h.Value)
	}
	e := &event{topic: r.Topic, partition: r.Partition, offset: r.Offset, payload: r.Value}
	id, ok := headers["id"]
	if !ok {
		return nil, fmt.Errorf("%s/%d@%d has no id header: INBOX_TOPICS must name only topics outboxd writes",
			r.Topic, r.Partition, r.Offset)
	}
	e.eventID, e.key = id, id
	if k, ok := headers["idempotency_key"]; ok && k != "" {
		e.key = k
	}
	if v, ok := headers["version"]; ok {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("header version is %q, not a whole number", v)
		}
		e.version = &n
	}
	e.aggregateType = headers["aggregate_type"]
	if r.Key != nil {
		k := string(r.Key)
		e.aggregateID = &k
	}
	return e, nil
}

type outcome struct {
	kind    string // applied, duplicate, stale, gap
	known   int64
	balance int64
}

func describe(e *event, o outcome) string {
	switch o.kind {
	case "applied":
		return fmt.Sprintf("applied %s: balance %d", e.where(), o.balance)
	case "duplicate":
		return fmt.Sprintf("duplicate %s: applied before, skipped", e.where())
	case "stale":
		return fmt.Sprintf("stale %s: version %d at or below %d, skipped", e.where(), *e.version, o.known)
	}
	return fmt.Sprintf("held %s: version %d after %d; waiting for the missing version, "+
		"the partition's commit stays here", e.where(), *e.version, o.known)
}

// process is steps 1-4: the key first, the version check, the change, one commit.
func process(ctx context.Context, db *pgx.Conn, s *settings, e *event) (outcome, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return outcome{}, err
	}
	// After a commit this does nothing; otherwise nothing is recorded and a retry applies.
	defer func() { _ = tx.Rollback(ctx) }()
	tag, err := tx.Exec(ctx, `INSERT INTO inbox_processed (consumer, key, event_id, topic,
		kafka_partition, kafka_offset) VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING`,
		s.group, e.key, e.eventID, e.topic, e.partition, e.offset)
	if err != nil {
		return outcome{}, err
	}
	if tag.RowsAffected() == 0 {
		return outcome{kind: "duplicate"}, nil
	}
	versioned := e.aggregateID != nil && e.version != nil
	if versioned {
		// A row to lock even for the aggregate's first event: racing consumers queue here.
		if _, err := tx.Exec(ctx, `INSERT INTO inbox_versions (consumer, aggregate_type,
			aggregate_id, version) VALUES ($1, $2, $3, NULL) ON CONFLICT DO NOTHING`,
			s.group, e.aggregateType, *e.aggregateID); err != nil {
			return outcome{}, err
		}
		var known *int64
		if err := tx.QueryRow(ctx, `SELECT version FROM inbox_versions WHERE consumer = $1
			AND aggregate_type = $2 AND aggregate_id = $3 FOR UPDATE`,
			s.group, e.aggregateType, *e.aggregateID).Scan(&known); err != nil {
			return outcome{}, err
		}
		if known != nil && *e.version <= *known {
			// Committed: the key stays, so a replay of it is a plain duplicate.
			return outcome{kind: "stale", known: *known}, tx.Commit(ctx)
		}
		if known != nil && *e.version > *known+1 {
			return outcome{kind: "gap", known: *known}, nil
		}
	}
	var payload struct {
		Amount *int64 `json:"amount"`
	}
	if err := json.Unmarshal(e.payload, &payload); err != nil || payload.Amount == nil {
		return outcome{}, fmt.Errorf("%s: the payload has no integer \"amount\"", e.where())
	}
	if e.aggregateID == nil {
		return outcome{}, fmt.Errorf("%s: the record has no key (the account)", e.where())
	}
	if _, err := tx.Exec(ctx, `INSERT INTO ledger (account, version, event_key, amount,
		applied_by) VALUES ($1, $2, $3, $4, $5)`,
		*e.aggregateID, e.version, e.key, *payload.Amount, s.instance); err != nil {
		return outcome{}, err
	}
	var balance int64
	if err := tx.QueryRow(ctx, `INSERT INTO balances (account, balance) VALUES ($1, $2)
		ON CONFLICT (account) DO UPDATE SET balance = balances.balance + EXCLUDED.balance
		RETURNING balance`, *e.aggregateID, *payload.Amount).Scan(&balance); err != nil {
		return outcome{}, err
	}
	if versioned {
		if _, err := tx.Exec(ctx, `UPDATE inbox_versions SET version = $4, updated_at = now()
			WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3`,
			s.group, e.aggregateType, *e.aggregateID, *e.version); err != nil {
			return outcome{}, err
		}
	}
	return outcome{kind: "applied", balance: balance}, tx.Commit(ctx)
}

type slot struct {
	topic     string
	partition int32
}

// partition is this consumer's place in one partition it owns.
type partition struct {
	next int64            // the offset after the last record handled
	held map[int64]*event // behind a version gap, by offset
}

// committable is what the group may commit: the first held record, else the next to read.
func (p *partition) committable() int64 {
	c := p.next
	for o := range p.held {
		if o < c {
			c = o
		}
	}
	return c
}

type consumer struct {
	s         *settings
	db        *pgx.Conn
	positions map[slot]*partition
}

func (c *consumer) handle(ctx context.Context, r *kgo.Record) error {
	e, err := readEvent(r)
	if err != nil {
		return err
	}
	at := slot{e.topic, e.partition}
	p, ok := c.positions[at]
	if !ok {
		p = &partition{next: e.offset, held: map[int64]*event{}}
		c.positions[at] = p
	}
	if e.offset < p.next {
		p.held = map[int64]*event{} // read again from earlier: the held records come again
	}
	p.next = e.offset + 1
	o, err := process(ctx, c.db, c.s, e)
	if err != nil {
		return err
	}
	fmt.Println(describe(e, o))
	if o.kind == "gap" {
		p.held[e.offset] = e
		if len(p.held) > maxHeld {
			first := p.held[p.committable()]
			return fmt.Errorf("%d records held in %s/%d behind a version gap (first: %s): repair "+
				"the missing version (re-send it from the dead-letter topic) or move "+
				"inbox_versions on, then restart", len(p.held), e.topic, e.partition, first.where())
		}
		return nil
	}
	if e.version == nil {
		return nil
	}
	// Release the held records of this aggregate, in offset order, until one is a gap.
	offsets := make([]int64, 0, len(p.held))
	for off := range p.held {
		offsets = append(offsets, off)
	}
	sort.Slice(offsets, func(i, j int) bool { return offsets[i] < offsets[j] })
	for _, off := range offsets {
		h := p.held[off]
		if h.aggregateType != e.aggregateType || h.aggregateID == nil || *h.aggregateID != *e.aggregateID {
			continue
		}
		released, err := process(ctx, c.db, c.s, h)
		if err != nil {
			return err
		}
		fmt.Println(describe(h, released))
		if released.kind == "gap" {
			break
		}
		delete(p.held, off)
	}
	return nil
}

// commit commits the committable offsets of the given partitions (all owned ones if nil).
func (c *consumer) commit(ctx context.Context, cl *kgo.Client, only map[string][]int32) error {
	offsets := map[string]map[int32]kgo.EpochOffset{}
	for at, p := range c.positions {
		if only != nil && !contains(only[at.topic], at.partition) {
			continue
		}
		if offsets[at.topic] == nil {
			offsets[at.topic] = map[int32]kgo.EpochOffset{}
		}
		offsets[at.topic][at.partition] = kgo.EpochOffset{Epoch: -1, Offset: p.committable()}
	}
	if len(offsets) == 0 {
		return nil
	}
	var failed error
	cl.CommitOffsetsSync(ctx, offsets, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest,
		resp *kmsg.OffsetCommitResponse, err error) {
		if err != nil {
			failed = err
			return
		}
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
					failed = fmt.Errorf("committing %s/%d: %w", t.Topic, p.Partition, err)
				}
			}
		}
	})
	return failed
}

func contains(list []int32, p int32) bool {
	for _, q := range list {
		if q == p {
			return true
		}
	}
	return false
}

func run(s *settings) error {
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	db, err := pgx.Connect(ctx, s.database)
	if err != nil {
		return err
	}
	defer db.Close(context.Background())
	// Consumers starting together must not race on CREATE TABLE.
	if err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtext('inbox-example.tables'))"); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, tables)
		return err
	}); err != nil {
		return err
	}
	c := &consumer{s: s, db: db, positions: map[slot]*partition{}}
	var callbackErr error
	drop := func(_ context.Context, _ *kgo.Client, parts map[string][]int32) {
		for topic, ps := range parts {
			for _, p := range ps {
				delete(c.positions, slot{topic, p})
			}
		}
	}
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(strings.Split(s.bootstrap, ",")...),
		kgo.ConsumerGroup(s.group),
		kgo.ConsumeTopics(s.topics...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		// Never an aborted transactional producer's records.
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		// The example commits, never past a held record.
		kgo.DisableAutoCommit(),
		kgo.SessionTimeout(s.session),
		kgo.HeartbeatInterval(s.heartbeat),
		// A rebalance waits until the records in hand are handled, so the revoke below
		// commits what was done and nothing is handled for a partition no longer owned.
		kgo.BlockRebalanceOnPoll(),
		kgo.OnPartitionsAssigned(drop), // read from the committed offset: held records come again
		kgo.OnPartitionsRevoked(func(ctx context.Context, cl *kgo.Client, parts map[string][]int32) {
			if err := c.commit(ctx, cl, parts); err != nil && callbackErr == nil {
				callbackErr = fmt.Errorf("committing revoked partitions: %w", err)
			}
			drop(ctx, cl, parts)
		}),
		// Lost (the session expired): another member may own them already; commit nothing.
		kgo.OnPartitionsLost(drop),
	)
	if err != nil {
		return err
	}
	defer cl.Close()
	fmt.Printf("inbox-example: consuming %v as group %s\n", s.topics, s.group)
	lastCommit, nextPrune, dirty := time.Now(), time.Now(), false
	for {
		// Bounded, so that the commit below also runs when no record comes.
		poll, stopPoll := context.WithTimeout(ctx, 500*time.Millisecond)
		fetches := cl.PollFetches(poll)
		stopPoll()
		if ctx.Err() != nil {
			break
		}
		var fetchErr error
		fetches.EachError(func(t string, p int32, err error) {
			if fetchErr == nil && !errors.Is(err, context.Canceled) &&
				!errors.Is(err, context.DeadlineExceeded) {
				fetchErr = fmt.Errorf("fetching %s/%d: %w", t, p, err)
			}
		})
		if fetchErr != nil {
			return fetchErr
		}
		var handleErr error
		fetches.EachRecord(func(r *kgo.Record) {
			if handleErr == nil {
				handleErr = c.handle(ctx, r)
			}
		})
		if handleErr != nil {
			return handleErr
		}
		if !fetches.Empty() {
			dirty = true
		}
		if dirty && time.Since(lastCommit) >= s.commitEvery {
			if err := c.commit(ctx, cl, nil); err != nil {
				return err
			}
			lastCommit, dirty = time.Now(), false
		}
		if s.keepHours > 0 && time.Now().After(nextPrune) {
			nextPrune = time.Now().Add(5 * time.Minute)
			var deleted int64
			if err := db.QueryRow(ctx, "SELECT public.inbox_prune($1, make_interval(hours => $2))",
				s.group, s.keepHours).Scan(&deleted); err != nil {
				return err
			}
			if deleted > 0 {
				fmt.Printf("pruned %d keys older than %d h\n", deleted, s.keepHours)
			}
		}
		cl.AllowRebalance()
		if callbackErr != nil {
			return callbackErr
		}
	}
	// Stopping: commit what was done, then leave the group (the deferred Close).
	done, stop := context.WithTimeout(context.Background(), 10*time.Second)
	defer stop()
	if err := c.commit(done, cl, nil); err != nil {
		return err
	}
	// Committed: the revoke while leaving has nothing more to do.
	c.positions = map[slot]*partition{}
	cl.AllowRebalance()
	return nil
}

func readSettings() (*settings, error) {
	required := func(name string) (string, error) {
		v := strings.TrimSpace(os.Getenv(name))
		if v == "" {
			return "", fmt.Errorf("%s is not set: see the table at the top of main.go", name)
		}
		return v, nil
	}
	s := &settings{group: "balances", instance: fmt.Sprintf("pid-%d", os.Getpid()),
		session: 45 * time.Second, heartbeat: 3 * time.Second, commitEvery: 5 * time.Second}
	var err error
	if s.database, err = required("INBOX_DATABASE_URL"); err != nil {
		return nil, err
	}
	if s.bootstrap, err = required("INBOX_BOOTSTRAP_SERVERS"); err != nil {
		return nil, err
	}
	topics, err := required("INBOX_TOPICS")
	if err != nil {
		return nil, err
	}
	for _, t := range strings.Split(topics, ",") {
		if t = strings.TrimSpace(t); t != "" {
			s.topics = append(s.topics, t)
		}
	}
	if g := os.Getenv("INBOX_GROUP"); g != "" {
		s.group = g
	}
	if i := os.Getenv("INBOX_INSTANCE"); i != "" {
		s.instance = i
	}
	for _, pair := range strings.Split(os.Getenv("INBOX_KAFKA_CONFIG"), ",") {
		if strings.TrimSpace(pair) == "" {
			continue
		}
		k, v, ok := strings.Cut(pair, "=")
		ms, perr := strconv.ParseUint(strings.TrimSpace(v), 10, 31)
		if !ok || perr != nil {
			return nil, fmt.Errorf("INBOX_KAFKA_CONFIG has %q: write name=milliseconds pairs separated by commas", pair)
		}
		d := time.Duration(ms) * time.Millisecond
		switch strings.TrimSpace(k) {
		case "session.timeout.ms":
			s.session = d
		case "heartbeat.interval.ms":
			s.heartbeat = d
		case "auto.commit.interval.ms":
			s.commitEvery = d
		default:
			return nil, fmt.Errorf("INBOX_KAFKA_CONFIG has %q: this example takes session.timeout.ms, "+
				"heartbeat.interval.ms and auto.commit.interval.ms; set others in kgo.NewClient", k)
		}
	}
	hours := strings.TrimSpace(os.Getenv("INBOX_KEEP_KEYS_HOURS"))
	if hours == "" {
		hours = "336"
	}
	h, err := strconv.ParseUint(hours, 10, 31)
	if err != nil {
		return nil, fmt.Errorf("INBOX_KEEP_KEYS_HOURS is %q: write a whole number of hours (0: keep all)", hours)
	}
	s.keepHours = int(h)
	return s, nil
}

func main() {
	s, err := readSettings()
	if err != nil {
		fmt.Fprintf(os.Stderr, "inbox-example: %v\n", err)
		os.Exit(2)
	}
	if err := run(s); err != nil {
		fmt.Fprintf(os.Stderr, "inbox-example: %v\n", err)
		os.Exit(1)
	}
	fmt.Println("inbox-example: stopped")
}
