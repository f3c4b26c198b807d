package engram_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"iter"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	engram "engram.dev/engram/clients/go"
	"engram.dev/engram/clients/go/engramv1"
)

// writeLock holds a SQLite database's write lock from another process (the
// sqlite3 shell), so the server's writes wait, then answer UNAVAILABLE.
type writeLock struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
}

func lockWrites(t *testing.T, database string) *writeLock {
	t.Helper()
	shell, err := exec.LookPath("sqlite3")
	if err != nil {
		t.Fatal("the sqlite3 shell is missing: apt-get install sqlite3")
	}
	cmd := exec.Command(shell, database)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lock := &writeLock{cmd: cmd, stdin: stdin}
	t.Cleanup(lock.release)
	if _, err := io.WriteString(stdin, "BEGIN IMMEDIATE;\nSELECT 'locked';\n"); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "locked" {
		t.Fatalf("sqlite3 did not take the lock: %q, %v", line, err)
	}
	return lock
}

func (l *writeLock) release() {
	if l.cmd.ProcessState != nil {
		return
	}
	_, _ = io.WriteString(l.stdin, "ROLLBACK;\n")
	_ = l.stdin.Close()
	_ = l.cmd.Wait()
}

// throughOutage runs call in the background, waits for its first retry
// (reported to retries), then ends the outage with end and returns what
// call returned and that retry.
func throughOutage[T any](ctx context.Context, t *testing.T, retries <-chan engram.Retry,
	call func() (T, error), end func()) (T, engram.Retry, error) {
	t.Helper()
	type outcome struct {
		response T
		err      error
	}
	done := make(chan outcome, 1)
	go func() {
		response, err := call()
		done <- outcome{response, err}
	}()
	var first engram.Retry
	select {
	case first = <-retries:
	case <-ctx.Done():
		t.Fatal("the client never retried")
	}
	end()
	landed := <-done
	return landed.response, first, landed.err
}

func TestRetriesThroughAnOutage(t *testing.T) {
	dir := t.TempDir()
	srv := start(t, dir, "127.0.0.1:0", "ENGRAM_DB_ACQUIRE_TIMEOUT_MS=300")
	retries := make(chan engram.Retry, 16)
	client := connect(t, srv.addr, engram.WithRetryObserver(func(r engram.Retry) { retries <- r }))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	set := func(c *engram.Client, ctx context.Context, v any, requestID string) (*engramv1.SetResponse, error) {
		return c.Memory.Set(ctx, &engramv1.SetRequest{
			ScopeType: ns, Scope: "retries", Key: "plan", Value: value(t, v), RequestId: requestID,
		})
	}

	// A write with its request id waits out the outage and lands once.
	lock := lockWrites(t, filepath.Join(dir, "engram.db"))
	landed, first, err := throughOutage(ctx, t, retries, func() (*engramv1.SetResponse, error) {
		return set(client, ctx, "a", "plan-1")
	}, lock.release)
	if err != nil {
		t.Fatalf("retried write: %v", err)
	}
	if got := landed.GetEntry().GetVersion(); got != 1 {
		t.Fatalf("version %d, want 1", got)
	}
	if first.Method != "/engram.v1.MemoryService/Set" || first.Attempt != 1 || first.Delay != time.Second {
		t.Fatalf("retry %+v: want Set's first try, waiting the server's second", first)
	}
	if engram.Reason(first.Err) != "DATABASE_UNAVAILABLE" {
		t.Fatalf("retried after %v", first.Err)
	}

	// A write without one is not retried: the first try may have landed.
	lock = lockWrites(t, filepath.Join(dir, "engram.db"))
	_, err = set(client, ctx, "b", "")
	failure, ok := engram.AsError(err)
	if !ok || failure.Code != codes.Unavailable || failure.RetryDelay != time.Second {
		t.Fatalf("unkeyed write during the outage: %v", err)
	}
	_, err = client.Episodes.AppendEpisode(ctx, &engramv1.AppendEpisodeRequest{
		App: "rt", User: "ann", SessionId: "rt-1",
		Episode: &engramv1.NewEpisode{Content: value(t, "hello")},
	})
	if status, _ := engram.AsError(err); status == nil || status.Code != codes.Unavailable {
		t.Fatalf("append without an id during the outage: %v", err)
	}

	// Retries end at their count, and at the deadline.
	once := connect(t, srv.addr, engram.WithRetries(1),
		engram.WithRetryObserver(func(r engram.Retry) { retries <- r }))
	if _, err := set(once, ctx, "c", "plan-2"); engram.Reason(err) != "DATABASE_UNAVAILABLE" {
		t.Fatalf("write past its retries: %v", err)
	}
	near, cancelNear := context.WithTimeout(ctx, 900*time.Millisecond)
	defer cancelNear()
	if _, err := set(client, near, "d", "plan-3"); engram.Reason(err) != "DATABASE_UNAVAILABLE" {
		t.Fatalf("write whose deadline is nearer than the retry: %v", err)
	}
	none := connect(t, srv.addr, engram.WithRetries(0),
		engram.WithRetryObserver(func(r engram.Retry) { retries <- r }))
	if _, err := set(none, ctx, "e", "plan-4"); engram.Reason(err) != "DATABASE_UNAVAILABLE" {
		t.Fatalf("write with retries off: %v", err)
	}
	lock.release()
	if n := len(retries); n != 1 {
		t.Fatalf("%d retries after the first write, want 1 (WithRetries(1))", n)
	}

	// Nothing of the refused writes was kept.
	history, err := client.Memory.History(ctx, &engramv1.HistoryRequest{ScopeType: ns, Scope: "retries", Key: "plan"})
	if err != nil {
		t.Fatal(err)
	}
	var versions []int64
	for {
		page, err := history.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		versions = append(versions, page.GetEntry().GetVersion())
	}
	if len(versions) != 1 || versions[0] != 1 {
		t.Fatalf("versions %v, want [1]", versions)
	}
}

// A creation (a session, a task) gets a request id from the client when
// it has none, so it is retried through an outage like any keyed write,
// and the retry finds what a try that landed made: one of each.
func TestCreationsLandOnceThroughAnOutage(t *testing.T) {
	dir := t.TempDir()
	srv := start(t, dir, "127.0.0.1:0", "ENGRAM_DB_ACQUIRE_TIMEOUT_MS=300")
	retries := make(chan engram.Retry, 16)
	client := connect(t, srv.addr, engram.WithRetryObserver(func(r engram.Retry) { retries <- r }))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	lock := lockWrites(t, filepath.Join(dir, "engram.db"))
	request := &engramv1.CreateSessionRequest{App: "rt", User: "cy"}
	landed, retry, err := throughOutage(ctx, t, retries, func() (*engramv1.CreateSessionResponse, error) {
		return client.Sessions.CreateSession(ctx, request)
	}, lock.release)
	if err != nil {
		t.Fatalf("retried creation: %v", err)
	}
	if retry.Method != "/engram.v1.SessionService/CreateSession" {
		t.Fatalf("retried %s", retry.Method)
	}
	if request.GetRequestId() != "" {
		t.Fatalf("the caller's request was changed: %v", request)
	}
	listed, err := client.Sessions.ListSessions(ctx, &engramv1.ListSessionsRequest{User: "cy"})
	if err != nil {
		t.Fatal(err)
	}
	if got := listed.GetSessions(); len(got) != 1 || got[0].GetId() != landed.GetSession().GetId() {
		t.Fatalf("sessions %v, want the one created", got)
	}

	// A task is keyed the same way: created once through an outage.
	lock = lockWrites(t, filepath.Join(dir, "engram.db"))
	created, _, err := throughOutage(ctx, t, retries, func() (*engramv1.CreateTaskResponse, error) {
		return client.WorkingMemory.CreateTask(ctx, &engramv1.CreateTaskRequest{
			SessionId: landed.GetSession().GetId(), Subject: "read the logs",
		})
	}, lock.release)
	if err != nil {
		t.Fatalf("retried task: %v", err)
	}
	tasks, err := client.WorkingMemory.ListTasks(ctx, &engramv1.ListTasksRequest{SessionId: landed.GetSession().GetId()})
	if err != nil {
		t.Fatal(err)
	}
	if got := tasks.GetTasks(); len(got) != 1 || got[0].GetId() != created.GetTask().GetId() {
		t.Fatalf("tasks %v, want the one created", got)
	}

	// So is an LLM's TaskCreate forwarded through CallTool.
	lock = lockWrites(t, filepath.Join(dir, "engram.db"))
	arguments, err := structpb.NewValue(map[string]any{"subject": "fix the parser"})
	if err != nil {
		t.Fatal(err)
	}
	called, retry, err := throughOutage(ctx, t, retries, func() (*engramv1.CallToolResponse, error) {
		return client.WorkingMemory.CallTool(ctx, &engramv1.CallToolRequest{
			SessionId: landed.GetSession().GetId(), Name: "TaskCreate", Arguments: arguments,
		})
	}, lock.release)
	if err != nil || called.GetIsError() {
		t.Fatalf("retried tool call: %v %v", called, err)
	}
	if retry.Method != "/engram.v1.WorkingMemoryService/CallTool" {
		t.Fatalf("retried %s", retry.Method)
	}
	tasks, err = client.WorkingMemory.ListTasks(ctx, &engramv1.ListTasksRequest{SessionId: landed.GetSession().GetId()})
	if err != nil {
		t.Fatal(err)
	}
	if got := tasks.GetTasks(); len(got) != 2 || got[1].GetId() != called.GetResult().GetFields()["taskId"].GetStringValue() {
		t.Fatalf("tasks %v, want the one called for second", got)
	}

	// A rule too.
	lock = lockWrites(t, filepath.Join(dir, "engram.db"))
	rule := &engramv1.ConsolidationRule{
		Id: "triage", Filter: "type = error", Cadence: &engramv1.ConsolidationRule_EveryNEpisodes{EveryNEpisodes: 5},
	}
	made, _, err := throughOutage(ctx, t, retries, func() (*engramv1.CreateRuleResponse, error) {
		return client.Consolidation.CreateRule(ctx, &engramv1.CreateRuleRequest{Rule: rule})
	}, lock.release)
	if err != nil || made.GetRule().GetId() != "triage" {
		t.Fatalf("retried rule: %v %v", made, err)
	}

	// What a retry after a lost reply sends, the same request id again,
	// is answered with the first session, as created.
	keyed := &engramv1.GetOrCreateSessionRequest{App: "rt", User: "cy", RequestId: "create-cy"}
	first, err := client.Sessions.GetOrCreateSession(ctx, keyed)
	if err != nil {
		t.Fatal(err)
	}
	again, err := client.Sessions.GetOrCreateSession(ctx, keyed)
	if err != nil {
		t.Fatal(err)
	}
	if !again.GetCreated() || again.GetSession().GetId() != first.GetSession().GetId() {
		t.Fatalf("repeat %v, want %v as created", again, first)
	}
}

func TestWhatIsRetried(t *testing.T) {
	episode := func(id string) *engramv1.NewEpisode { return &engramv1.NewEpisode{Id: id} }
	for _, c := range []struct {
		request proto.Message
		retried bool
	}{
		{&engramv1.GetRequest{Key: "k"}, true},
		{&engramv1.SearchRequest{Query: "q"}, true},
		{&engramv1.SetRequest{Key: "k"}, false},
		{&engramv1.SetRequest{Key: "k", RequestId: "r"}, true},
		{&engramv1.DeleteRequest{Key: "k"}, false},
		{&engramv1.DeleteRequest{Key: "k", RequestId: "r"}, true},
		{&engramv1.AppendEpisodeRequest{Episode: episode("")}, false},
		{&engramv1.AppendEpisodeRequest{Episode: episode("e")}, true},
		{&engramv1.AppendEpisodesRequest{}, false},
		{&engramv1.AppendEpisodesRequest{Episodes: []*engramv1.NewEpisode{episode("e"), episode("")}}, false},
		{&engramv1.AppendEpisodesRequest{Episodes: []*engramv1.NewEpisode{episode("e"), episode("f")}}, true},
		{&engramv1.GetOrCreateSessionRequest{App: "a", User: "u"}, false},
		{&engramv1.GetOrCreateSessionRequest{App: "a", User: "u", SessionId: "s"}, true},
		{&engramv1.GetOrCreateSessionRequest{App: "a", User: "u", RequestId: "r"}, true},
		{&engramv1.CreateSessionRequest{App: "a", User: "u", SessionId: "s"}, false},
		{&engramv1.CreateSessionRequest{App: "a", User: "u", RequestId: "r"}, true},
		{&engramv1.RollbackRequest{Key: "k"}, false},
		{&engramv1.SetGoalRequest{Goal: "g"}, true},
		{&engramv1.UpdateTaskRequest{TaskId: "t1"}, true},
		{&engramv1.CacheContentRequest{Path: "p"}, true},
		{&engramv1.CreateTaskRequest{Subject: "s"}, false},
		{&engramv1.RememberRequest{Content: "c"}, false},
		{&engramv1.CreateTaskRequest{Subject: "s", RequestId: "r"}, true},
		{&engramv1.RememberRequest{Content: "c", RequestId: "r"}, true},
		{&engramv1.RecordProcedureRequest{Content: "c", RequestId: "r"}, true},
		{&engramv1.CreateRuleRequest{}, false},
		{&engramv1.CreateRuleRequest{RequestId: "r"}, true},
		{&engramv1.CallToolRequest{Name: "TaskCreate"}, false},
		{&engramv1.CallToolRequest{Name: "Remember", RequestId: "call_1"}, true},
		{&engramv1.CallToolRequest{Name: "memory.set_goal"}, true},
		{&engramv1.CallToolRequest{Name: "TaskUpdate"}, true},
		{&engramv1.EndSessionRequest{SessionId: "s"}, true},
		{&engramv1.DeleteSessionRequest{SessionId: "s"}, false},
		{&engramv1.SetRetentionRequest{Scope: "s"}, true},
		{&engramv1.ReindexRequest{Apply: true}, true},
		{nil, false},
	} {
		if got := engram.Idempotent(c.request); got != c.retried {
			t.Errorf("Idempotent(%T %v) = %v, want %v", c.request, c.request, got, c.retried)
		}
	}
}

// The chart has the server end each connection after a while (a GOAWAY);
// the connection is replaced on its own, so no call fails, with retries off
// and writes unkeyed. Writes for three seconds over one-second-old
// connections.
func TestCallsGoOnWhileTheServerAgesConnectionsOut(t *testing.T) {
	srv := start(t, t.TempDir(), "127.0.0.1:0", "ENGRAM_MAX_CONNECTION_AGE_SECS=1")
	client := connect(t, srv.addr, engram.WithRetries(0))
	ctx := context.Background()
	var written int64
	for ends := time.Now().Add(3 * time.Second); time.Now().Before(ends); {
		written++
		response, err := client.Memory.Set(ctx, &engramv1.SetRequest{
			ScopeType: ns, Scope: "aged", Key: "k", Value: value(t, written),
		})
		if err != nil {
			t.Fatalf("write %d: %v", written, err)
		}
		if got := response.GetEntry().GetVersion(); got != written {
			t.Fatalf("version %d, want %d", got, written)
		}
	}
}

// A read whose first try finds no server (a pod restarting) is retried
// once the server listens again on the same address, within the deadline.
func TestARetryWaitsForARestartingServer(t *testing.T) {
	dir := t.TempDir()
	first := start(t, dir, "127.0.0.1:0")
	addr := first.addr
	retries := make(chan engram.Retry, 16)
	client := connect(t, addr, engram.WithRetryObserver(func(r engram.Retry) { retries <- r }))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	get := &engramv1.GetRequest{ScopeType: ns, Scope: "restart", Key: "k"}
	if _, err := client.Memory.Set(ctx, &engramv1.SetRequest{
		ScopeType: ns, Scope: "restart", Key: "k", Value: value(t, "kept"),
	}); err != nil {
		t.Fatal(err)
	}
	first.stop()

	read, _, err := throughOutage(ctx, t, retries, func() (*engramv1.GetResponse, error) {
		return client.Memory.Get(ctx, get)
	}, func() { start(t, dir, addr) })
	if err != nil {
		t.Fatalf("a read across the restart: %v", err)
	}
	if got := read.GetEntry().GetValue().GetStringValue(); got != "kept" {
		t.Fatalf("read %q", got)
	}
	if n := len(retries); n != 0 {
		t.Fatalf("%d more retries: the retry should have waited for the server", n)
	}
}

// A History stream that breaks (its server killed after the first version
// was read, then back on the same address) is read on from the version
// after the last one yielded: every version once, in order. The versions
// (10 of about 900 KB of punctuation, which the search index has no words
// in, so the writes are quick) are more than gRPC's flow control lets a
// server send ahead of a reader that has taken one (it was seen to hold
// under two).
func TestAllVersionsResumesAfterABrokenStream(t *testing.T) {
	const versions = 10
	dir := t.TempDir()
	first := start(t, dir, "127.0.0.1:0")
	addr := first.addr
	retries := make(chan engram.Retry, versions)
	client := connect(t, addr, engram.WithRetryObserver(func(r engram.Retry) { retries <- r }))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	padding := strings.Repeat(".", 900_000)
	for i := 1; i <= versions; i++ {
		if _, err := client.Memory.Set(ctx, &engramv1.SetRequest{
			ScopeType: ns, Scope: "resume", Key: "big",
			Value: value(t, map[string]any{"i": i, "padding": padding}),
		}); err != nil {
			t.Fatal(err)
		}
	}
	next, stop := iter.Pull2(client.AllVersions(ctx, &engramv1.HistoryRequest{ScopeType: ns, Scope: "resume", Key: "big"}))
	defer stop()
	var read []int64
	entry, err, ok := next()
	if !ok || err != nil {
		t.Fatalf("the first version: %v", err)
	}
	read = append(read, entry.GetVersion())
	_ = first.cmd.Process.Kill()
	_ = first.cmd.Wait()
	start(t, dir, addr)
	for {
		entry, err, ok := next()
		if !ok {
			break
		}
		if err != nil {
			t.Fatalf("after version %d: %v", read[len(read)-1], err)
		}
		if got := int64(entry.GetValue().GetStructValue().GetFields()["i"].GetNumberValue()); got != entry.GetVersion() {
			t.Fatalf("version %d holds %d", entry.GetVersion(), got)
		}
		read = append(read, entry.GetVersion())
	}
	for i, version := range read {
		if version != int64(i+1) {
			t.Fatalf("versions %v, want 1 to %d once each, in order", read, versions)
		}
	}
	if len(read) != versions {
		t.Fatalf("%d versions, want %d", len(read), versions)
	}
	select {
	case retry := <-retries:
		if retry.Method != engramv1.MemoryService_History_FullMethodName {
			t.Fatalf("a retry of %s", retry.Method)
		}
	default:
		t.Fatal("the stream never broke: nothing was resumed")
	}
}

// A retry waits for the server only until the deadline, and the call then
// says why it waited (Unavailable), not only that time ran out.
func TestAServerThatStaysAwayIsReportedUnavailable(t *testing.T) {
	gone := start(t, t.TempDir(), "127.0.0.1:0")
	gone.stop()
	client := connect(t, gone.addr)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := client.Memory.Get(ctx, &engramv1.GetRequest{ScopeType: ns, Scope: "gone", Key: "k"})
	if failure, ok := engram.AsError(err); !ok || failure.Code != codes.Unavailable {
		t.Fatalf("a read of a server that stays away: %v", err)
	}
}

// postgresDatabase makes an empty database on the Postgres server of
// ENGRAM_TEST_DATABASE_URL (scripts/test starts one) and returns its URL;
// the test is skipped without one.
func postgresDatabase(t *testing.T) string {
	t.Helper()
	base := os.Getenv("ENGRAM_TEST_DATABASE_URL")
	if base == "" {
		t.Skip("needs Postgres: ENGRAM_TEST_DATABASE_URL (scripts/test sets it)")
	}
	name := fmt.Sprintf("engram_go_%d", time.Now().UnixNano())
	psql(t, base, "CREATE DATABASE "+name)
	return base[:strings.LastIndex(base, "/")+1] + name
}

func psql(t *testing.T, url, statement string) {
	t.Helper()
	command := "psql"
	if dir := os.Getenv("PG_BINDIR"); dir != "" {
		command = filepath.Join(dir, "psql")
	}
	if out, err := exec.Command(command, url, "-qAtc", statement).CombinedOutput(); err != nil {
		t.Fatalf("psql %q: %v: %s", statement, err, out)
	}
}

// failNextInsert makes Postgres fail the next insert into table with an
// error of sqlstate, as a deadlock it broke (40P01) would: a trigger
// raises it, counting on a sequence, which no rollback undoes. The failed
// transaction is rolled back whole, as a real one is.
func failNextInsert(t *testing.T, url, table, sqlstate string) {
	t.Helper()
	psql(t, url, fmt.Sprintf(`CREATE SEQUENCE injected_%[1]s;
		CREATE FUNCTION injected_%[1]s() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN IF nextval('injected_%[1]s') = 1 THEN
		RAISE EXCEPTION 'injected' USING ERRCODE = '%[2]s'; END IF; RETURN NEW; END $$;
		CREATE TRIGGER injected BEFORE INSERT ON %[1]s
		FOR EACH ROW EXECUTE FUNCTION injected_%[1]s()`, table, sqlstate))
	t.Cleanup(func() {
		psql(t, url, fmt.Sprintf(`DROP TRIGGER injected ON %[1]s;
			DROP FUNCTION injected_%[1]s(); DROP SEQUENCE injected_%[1]s`, table))
	})
}

// A deadlock Postgres broke rolls the call's transaction back, and the
// server says so (TRANSACTION_CONFLICT): even a write with no idempotency
// key is then tried again, and lands once.
func TestAWriteIsRetriedAfterAFailureThatWroteNothing(t *testing.T) {
	url := postgresDatabase(t)
	srv := start(t, t.TempDir(), "127.0.0.1:0", "ENGRAM_DATABASE_URL="+url)
	retries := make(chan engram.Retry, 16)
	client := connect(t, srv.addr, engram.WithRetryObserver(func(r engram.Retry) { retries <- r }))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	appendOne := func(c *engram.Client, content string) (*engramv1.AppendEpisodeResponse, error) {
		return c.Episodes.AppendEpisode(ctx, &engramv1.AppendEpisodeRequest{
			SessionId: "conflict-1", App: "rt", User: "ann",
			Episode: &engramv1.NewEpisode{Type: "message", Content: value(t, content)},
		})
	}
	contents := func() []string {
		reply, err := client.Episodes.ListEpisodes(ctx, &engramv1.ListEpisodesRequest{SessionId: "conflict-1"})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, episode := range reply.GetEpisodes() {
			got = append(got, episode.GetContent().GetStringValue())
		}
		return got
	}

	failNextInsert(t, url, "episodes", "40P01")
	reply, err := appendOne(client, "hello")
	if err != nil {
		t.Fatalf("append: %v", err)
	}
	if seq := reply.GetEpisode().GetSeq(); seq != 1 {
		t.Fatalf("seq %d, want 1", seq)
	}
	if len(retries) != 1 {
		t.Fatalf("%d retries, want 1", len(retries))
	}
	retry := <-retries
	if failure, ok := engram.AsError(retry.Err); !ok || failure.Reason != "TRANSACTION_CONFLICT" ||
		retry.Method != "/engram.v1.EpisodeService/AppendEpisode" {
		t.Fatalf("retry %+v", retry)
	}
	if got := contents(); len(got) != 1 || got[0] != "hello" {
		t.Fatalf("episodes %q, want [hello]", got)
	}

	// With retries off the caller hears it, and nothing was written.
	psql(t, url, "ALTER SEQUENCE injected_episodes RESTART")
	_, err = appendOne(connect(t, srv.addr, engram.WithRetries(0)), "again")
	if failure, ok := engram.AsError(err); !ok || failure.Code != codes.Aborted ||
		failure.Reason != "TRANSACTION_CONFLICT" {
		t.Fatalf("append with retries off: %v", err)
	}
	if got := contents(); len(got) != 1 {
		t.Fatalf("episodes %q, want only the first", got)
	}
}
