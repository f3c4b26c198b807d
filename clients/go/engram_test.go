package engram_test

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	engram "engram.dev/engram/clients/go"
	"engram.dev/engram/clients/go/engramv1"
)

// server runs the real engram binary (ENGRAM_BIN, or the repository's debug
// build) on an ephemeral port with a SQLite file in dir.
type server struct {
	cmd  *exec.Cmd
	addr string
}

func binary() string {
	if bin := os.Getenv("ENGRAM_BIN"); bin != "" {
		return bin
	}
	return filepath.Join("..", "..", "target", "debug", "engram")
}

func start(t *testing.T, dir, addr string, env ...string) *server {
	t.Helper()
	cmd := exec.Command(binary(), "serve", "--grpc-addr", addr, "--http-addr", "127.0.0.1:0")
	cmd.Env = append(os.Environ(),
		"ENGRAM_DATABASE_URL=sqlite://"+filepath.Join(dir, "engram.db"),
		"ENGRAM_LOG_FORMAT=json",
		"ENGRAM_SHUTDOWN_GRACE_SECS=2")
	cmd.Env = append(cmd.Env, env...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start engram: %v", err)
	}
	lines := bufio.NewScanner(stderr)
	for lines.Scan() {
		var event map[string]any
		if json.Unmarshal(lines.Bytes(), &event) != nil {
			continue
		}
		if bound, ok := event["grpc_addr"].(string); ok {
			go func() {
				for lines.Scan() {
				}
			}()
			s := &server{cmd: cmd, addr: bound}
			t.Cleanup(s.stop)
			return s
		}
	}
	t.Fatalf("engram exited before listening: %v", cmd.Wait())
	return nil
}

func (s *server) stop() {
	if s.cmd.ProcessState == nil {
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		_ = s.cmd.Wait()
	}
}

func connect(t *testing.T, addr string, opts ...engram.Option) *engram.Client {
	t.Helper()
	client, err := engram.New(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	return client
}

func value(t *testing.T, v any) *structpb.Value {
	t.Helper()
	out, err := structpb.NewValue(v)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

const ns = engramv1.ScopeType_SCOPE_TYPE_NAMESPACE

func TestMemory(t *testing.T) {
	srv := start(t, t.TempDir(), "127.0.0.1:0")
	client := connect(t, srv.addr)
	ctx := context.Background()

	set := func(key string, v any, expected *int64) (*engramv1.MemoryEntry, error) {
		response, err := client.Memory.Set(ctx, &engramv1.SetRequest{
			ScopeType: ns, Scope: "prefs", Key: key, Value: value(t, v), ExpectedVersion: expected,
		})
		return response.GetEntry(), err
	}
	first, err := set("user/theme", map[string]any{"mode": "dark"}, nil)
	if err != nil || first.GetVersion() != 1 {
		t.Fatalf("set: %v %v", first, err)
	}
	if _, err := set("user/theme", "light", nil); err != nil {
		t.Fatal(err)
	}
	got, err := client.Memory.Get(ctx, &engramv1.GetRequest{ScopeType: ns, Scope: "prefs", Key: "user/theme"})
	if err != nil || got.GetEntry().GetValue().GetStringValue() != "light" {
		t.Fatalf("get: %v %v", got, err)
	}
	list, err := client.Memory.List(ctx, &engramv1.ListRequest{ScopeType: ns, Scope: "prefs", KeyPrefix: "user/"})
	if err != nil || len(list.GetEntries()) != 1 {
		t.Fatalf("list: %v %v", list, err)
	}
	// A retried delete with the same request id answers with the first
	// tombstone and writes no other.
	deleteRequest := &engramv1.DeleteRequest{ScopeType: ns, Scope: "prefs", Key: "user/theme", RequestId: "d1"}
	for attempt := 0; attempt < 2; attempt++ {
		deleted, err := client.Memory.Delete(ctx, deleteRequest)
		if err != nil || deleted.GetEntry().GetVersion() != 3 || !deleted.GetEntry().GetDeleted() {
			t.Fatalf("delete, attempt %d: %v %v", attempt, deleted, err)
		}
	}
	history, err := client.Memory.History(ctx, &engramv1.HistoryRequest{ScopeType: ns, Scope: "prefs", Key: "user/theme"})
	if err != nil {
		t.Fatal(err)
	}
	var versions []int64
	for {
		response, err := history.Recv()
		if err != nil {
			break
		}
		versions = append(versions, response.GetEntry().GetVersion())
	}
	if len(versions) != 3 || versions[2] != 3 {
		t.Fatalf("history versions %v", versions)
	}

	// A lost compare-and-set and an invalid key carry their reasons.
	_, err = set("k", 1, proto.Int64(7))
	e, ok := engram.AsError(err)
	if !ok || e.Code != codes.Aborted || e.Reason != "VERSION_MISMATCH" || e.Metadata["current_version"] != "0" {
		t.Fatalf("CAS: %#v", e)
	}
	_, err = set("has space", 1, nil)
	if e, ok := engram.AsError(err); !ok || e.Reason != "INVALID_IDENTIFIER" || e.Fields["key"] == "" {
		t.Fatalf("invalid key: %#v", e)
	}
	_, err = client.Memory.Get(ctx, &engramv1.GetRequest{ScopeType: ns, Scope: "prefs", Key: "user/theme"})
	if engram.Reason(err) != "KEY_DELETED" {
		t.Fatalf("deleted key: %v", err)
	}

	// Rollback brings the deleted key back with its first value.
	rolled, err := client.Memory.Rollback(ctx, &engramv1.RollbackRequest{ScopeType: ns, Scope: "prefs", Key: "user/theme", ToVersion: 1})
	if err != nil || rolled.GetEntry().GetVersion() != 4 || rolled.GetEntry().GetValue().GetStructValue().GetFields()["mode"].GetStringValue() != "dark" || rolled.GetAuditKey() == "" {
		t.Fatalf("rollback: %v %v", rolled, err)
	}
	_, err = client.Memory.Rollback(ctx, &engramv1.RollbackRequest{ScopeType: ns, Scope: "prefs", Key: "user/theme", ToVersion: 3})
	if engram.Reason(err) != "ROLLBACK_TO_TOMBSTONE" {
		t.Fatalf("rollback to a tombstone: %v", err)
	}

	// As of the first write's revision the key held its first value, and a
	// fork at that revision copies that state into a new scope.
	watch, err := client.Memory.Watch(ctx, &engramv1.WatchRequest{ScopeType: ns, Scope: "prefs", FromRevision: proto.Int64(0)})
	if err != nil {
		t.Fatal(err)
	}
	change, err := watch.Recv()
	if err != nil {
		t.Fatal(err)
	}
	then := &engramv1.AsOf{Point: &engramv1.AsOf_Revision{Revision: change.GetRevision()}}
	old, err := client.Memory.Get(ctx, &engramv1.GetRequest{ScopeType: ns, Scope: "prefs", Key: change.GetKey(), AsOf: then})
	if err != nil || old.GetEntry().GetVersion() != 1 {
		t.Fatalf("get as of %d: %v %v", change.GetRevision(), old, err)
	}
	forked, err := client.Memory.ForkScope(ctx, &engramv1.ForkScopeRequest{
		SourceScopeType: ns, SourceScope: "prefs", TargetScopeType: ns, TargetScope: "prefs-replay", AsOf: then,
	})
	if err != nil || forked.GetKeysCopied() != 1 || forked.GetRevision() != change.GetRevision() {
		t.Fatalf("fork: %v %v", forked, err)
	}
	_, err = client.Memory.ForkScope(ctx, &engramv1.ForkScopeRequest{
		SourceScopeType: ns, SourceScope: "prefs", TargetScopeType: ns, TargetScope: "prefs-replay",
	})
	if engram.Reason(err) != "SCOPE_NOT_EMPTY" {
		t.Fatalf("fork into a scope with keys: %v", err)
	}

	// ForgetUser counts first, then deletes the user's session and episodes.
	_, err = client.Episodes.AppendEpisode(ctx, &engramv1.AppendEpisodeRequest{
		SessionId: "forget-1", App: "bot", User: "dave",
		Episode: &engramv1.NewEpisode{Type: "observation", Content: value(t, 1)},
	})
	if err != nil {
		t.Fatal(err)
	}
	dry, err := client.Data.ForgetUser(ctx, &engramv1.ForgetUserRequest{App: "bot", User: "dave", DryRun: true})
	if err != nil || dry.GetSessions() != 1 || dry.GetEpisodes() != 1 || !dry.GetDryRun() {
		t.Fatalf("forget dry run: %v %v", dry, err)
	}
	done, err := client.Data.ForgetUser(ctx, &engramv1.ForgetUserRequest{App: "bot", User: "dave"})
	if err != nil || done.GetSessions() != 1 || done.GetAuditKey() == "" {
		t.Fatalf("forget: %v %v", done, err)
	}
	_, err = client.Sessions.GetSession(ctx, &engramv1.GetSessionRequest{SessionId: "forget-1"})
	if engram.Reason(err) != "SESSION_NOT_FOUND" {
		t.Fatalf("forgotten session: %v", err)
	}
}

func TestExportAndImport(t *testing.T) {
	source := connect(t, start(t, t.TempDir(), "127.0.0.1:0").addr)
	target := connect(t, start(t, t.TempDir(), "127.0.0.1:0").addr)
	ctx := context.Background()
	for i := 0; i < 2; i++ {
		_, err := source.Memory.Set(ctx, &engramv1.SetRequest{
			ScopeType: engramv1.ScopeType_SCOPE_TYPE_NAMESPACE, Scope: "prefs", Key: "k", Value: value(t, i),
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	_, err := source.Episodes.AppendEpisode(ctx, &engramv1.AppendEpisodeRequest{
		SessionId: "ex-1", App: "bot", User: "erin",
		Episode: &engramv1.NewEpisode{Type: "observation", Content: value(t, "hi")},
	})
	if err != nil {
		t.Fatal(err)
	}
	var file strings.Builder
	written, err := source.ExportTo(ctx, &engramv1.ExportRequest{}, &file)
	if err != nil || written != 6 || !strings.HasSuffix(file.String(), `{"kind":"end","lines":5}`+"\n") {
		t.Fatalf("export: %d lines (the header, 4 records, the end line), %v\n%s", written, err, file.String())
	}
	done, err := target.Import(ctx, strings.NewReader(file.String()))
	if err != nil || done.GetImported()["memory_version"] != 2 || done.GetImported()["episode"] != 1 {
		t.Fatalf("import: %v %v", done, err)
	}
	again, err := target.Import(ctx, strings.NewReader(file.String()))
	if err != nil || len(again.GetImported()) != 0 || again.GetUnchanged()["session"] != 1 {
		t.Fatalf("import again: %v %v", again, err)
	}
	var copied strings.Builder
	if _, err := target.ExportTo(ctx, &engramv1.ExportRequest{}, &copied); err != nil {
		t.Fatal(err)
	}
	body := func(export string) string { return export[strings.Index(export, "\n"):] }
	if body(copied.String()) != body(file.String()) {
		t.Fatalf("exports differ:\n%s\n%s", file.String(), copied.String())
	}
	_, err = target.Import(ctx, strings.NewReader("not json\n"))
	if e, ok := engram.AsError(err); !ok || e.Reason != "IMPORT_MALFORMED" || e.Fields["line 1"] == "" {
		t.Fatalf("malformed import: %v", err)
	}
}

func TestCallerContextAndAdmin(t *testing.T) {
	srv := start(t, t.TempDir(), "127.0.0.1:0")
	client := connect(t, srv.addr, engram.WithCallerContext(engram.CallerContext{
		ExecutionID: "run-1", FlowName: "research_agent",
	}))
	ctx := context.Background()
	for i := 0; i < 2; i++ {
		response, err := client.Memory.Set(ctx, &engramv1.SetRequest{Key: "notes", Value: value(t, i)})
		if err != nil {
			t.Fatal(err)
		}
		if entry := response.GetEntry(); entry.GetScope() != "research_agent" || entry.GetExecutionId() != "run-1" {
			t.Fatalf("entry %v", entry)
		}
	}
	purged, err := client.MemoryAdmin.Purge(ctx, &engramv1.PurgeRequest{
		ScopeType: engramv1.ScopeType_SCOPE_TYPE_FLOW, Scope: "research_agent", Key: "notes", Keep: proto.Int64(1),
	})
	if err != nil || purged.GetVersionsDeleted() != 1 {
		t.Fatalf("purge: %v %v", purged, err)
	}

	// Retention: a preview stores nothing; the policy applied keeps one version.
	preview, err := client.MemoryAdmin.SetRetention(ctx, &engramv1.SetRetentionRequest{
		ScopeType: engramv1.ScopeType_SCOPE_TYPE_FLOW, Scope: "research_agent",
		Policy: &engramv1.RetentionPolicy{KeepVersions: proto.Int64(1)}, DryRun: true,
	})
	if err != nil || preview.GetRetention() != nil {
		t.Fatalf("retention preview: %v %v", preview, err)
	}
	_, err = client.MemoryAdmin.SetRetention(ctx, &engramv1.SetRetentionRequest{
		ScopeType: engramv1.ScopeType_SCOPE_TYPE_FLOW, Scope: "research_agent",
		Policy: &engramv1.RetentionPolicy{KeepVersions: proto.Int64(0)},
	})
	if engram.Reason(err) != "INVALID_ARGUMENT" {
		t.Fatalf("keep 0: %v", err)
	}
	got, err := client.MemoryAdmin.GetRetention(ctx, &engramv1.GetRetentionRequest{
		ScopeType: engramv1.ScopeType_SCOPE_TYPE_FLOW, Scope: "research_agent",
	})
	if engram.Reason(err) != "RETENTION_NOT_FOUND" {
		t.Fatalf("no policy stored by a preview: %v %v", got, err)
	}
}

func TestSessionsEpisodesAndTheRest(t *testing.T) {
	srv := start(t, t.TempDir(), "127.0.0.1:0")
	client := connect(t, srv.addr)
	ctx := context.Background()
	if _, err := client.Sessions.CreateSession(ctx, &engramv1.CreateSessionRequest{App: "bot", User: "alice", SessionId: "chat-1"}); err != nil {
		t.Fatal(err)
	}
	_, err := client.Sessions.GetOrCreateSession(ctx, &engramv1.GetOrCreateSessionRequest{App: "bot", User: "mallory", SessionId: "chat-1"})
	if engram.Reason(err) != "SESSION_OWNER_MISMATCH" {
		t.Fatalf("owner mismatch: %v", err)
	}
	first := ""
	for i, text := range []string{"Hello!", "Hi there!"} {
		kind := []string{"user_message", "agent_response"}[i]
		response, err := client.Episodes.AppendEpisode(ctx, &engramv1.AppendEpisodeRequest{
			SessionId: "chat-1", Episode: &engramv1.NewEpisode{Type: kind, Content: value(t, text)},
		})
		if err != nil || response.GetEpisode().GetSeq() != int64(i+1) {
			t.Fatalf("append: %v %v", response, err)
		}
		if i == 0 {
			first = response.GetEpisode().GetId()
		}
	}
	got, err := client.Episodes.GetEpisode(ctx, &engramv1.GetEpisodeRequest{Id: first})
	if err != nil || got.GetEpisode().GetSessionId() != "chat-1" || got.GetEpisode().GetSeq() != 1 {
		t.Fatalf("get episode: %v %v", got, err)
	}
	_, err = client.Episodes.GetEpisode(ctx, &engramv1.GetEpisodeRequest{Id: "no-such-episode"})
	if e, ok := engram.AsError(err); !ok || e.Code != codes.NotFound || e.Reason != "EPISODE_NOT_FOUND" {
		t.Fatalf("missing episode: %v", err)
	}
	built, err := client.Episodes.BuildContext(ctx, &engramv1.BuildContextRequest{SessionId: "chat-1"})
	if err != nil || built.GetContext() != "User: Hello!\nAssistant: Hi there!" {
		t.Fatalf("context: %q %v", built.GetContext(), err)
	}
	rule := &engramv1.ConsolidationRule{Id: "all", Cadence: &engramv1.ConsolidationRule_EveryNEpisodes{EveryNEpisodes: 1}}
	if _, err := client.Consolidation.CreateRule(ctx, &engramv1.CreateRuleRequest{Rule: rule}); err != nil {
		t.Fatal(err)
	}
	run, err := client.Consolidation.RunRule(ctx, &engramv1.RunRuleRequest{RuleId: "all", DryRun: true})
	if err != nil || len(run.GetDeltas()) != 2 {
		t.Fatalf("run: %v %v", run, err)
	}
	call, err := client.WorkingMemory.CallTool(ctx, &engramv1.CallToolRequest{
		SessionId: "chat-1", Name: "TaskCreate", Arguments: value(t, `{"subject": "Reply"}`),
	})
	if err != nil || call.GetResult().GetFields()["taskId"].GetStringValue() != "t1" {
		t.Fatalf("call tool: %v %v", call, err)
	}
	block, err := client.WorkingMemory.RenderMemoryBlock(ctx, &engramv1.RenderMemoryBlockRequest{SessionId: "chat-1"})
	if err != nil || !strings.Contains(block.GetMemoryBlock(), "- [pending] t1: Reply") {
		t.Fatalf("block: %v %v", block, err)
	}
	// With RequireSession an append never creates its session.
	if _, err := client.Sessions.CreateSession(ctx, &engramv1.CreateSessionRequest{App: "bot", User: "alice", SessionId: "chat-2"}); err != nil {
		t.Fatal(err)
	}
	for _, session := range []string{"chat-2", "chat-9"} {
		_, err := client.Episodes.AppendEpisode(ctx, &engramv1.AppendEpisodeRequest{
			SessionId: session, App: "bot", User: "alice", RequireSession: true,
			Episode: &engramv1.NewEpisode{Type: "observation", Content: value(t, "x")},
		})
		if session == "chat-2" && err != nil {
			t.Fatalf("append to an existing session: %v", err)
		}
		if session == "chat-9" && engram.Reason(err) != "SESSION_NOT_FOUND" {
			t.Fatalf("append requiring a missing session: %v", err)
		}
	}
	if _, err := client.Sessions.GetSession(ctx, &engramv1.GetSessionRequest{SessionId: "chat-9"}); engram.Reason(err) != "SESSION_NOT_FOUND" {
		t.Fatalf("a session was created: %v", err)
	}
}

func TestSearch(t *testing.T) {
	srv := start(t, t.TempDir(), "127.0.0.1:0")
	client := connect(t, srv.addr)
	ctx := context.Background()
	for i, user := range []string{"alice", "bob"} {
		text := []string{"the deployment setup uses helm", "a deployment elsewhere"}[i]
		if _, err := client.Episodes.AppendEpisode(ctx, &engramv1.AppendEpisodeRequest{
			SessionId: "chat-" + user, App: "bot", User: user,
			Episode: &engramv1.NewEpisode{Type: "user_message", Content: value(t, text)},
		}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := client.Memory.Set(ctx, &engramv1.SetRequest{
		ScopeType: engramv1.ScopeType_SCOPE_TYPE_NAMESPACE, Scope: "ops", Key: "deploy/notes",
		Value: value(t, `{"text": "deployment checklist"}`),
	}); err != nil {
		t.Fatal(err)
	}
	hits, err := client.Search(ctx, &engramv1.SearchRequest{Query: "deployment setup"})
	if err != nil || len(hits) != 3 {
		t.Fatalf("search: %v %v", hits, err)
	}
	if hits[0].GetEpisode().GetUser() != "alice" || !strings.Contains(hits[0].GetSnippet(), "**") {
		t.Fatalf("best hit: %v", hits[0])
	}
	bob, err := client.Search(ctx, &engramv1.SearchRequest{
		Query: "deployment", User: "bob",
		Sources: []engramv1.SearchSource{engramv1.SearchSource_SEARCH_SOURCE_EPISODES},
	})
	if err != nil || len(bob) != 1 || bob[0].GetEpisode().GetSessionId() != "chat-bob" {
		t.Fatalf("bob: %v %v", bob, err)
	}
	memory, err := client.Search(ctx, &engramv1.SearchRequest{
		Query: "checklist", Sources: []engramv1.SearchSource{engramv1.SearchSource_SEARCH_SOURCE_MEMORY},
	})
	if err != nil || len(memory) != 1 || memory[0].GetEntry().GetKey() != "deploy/notes" {
		t.Fatalf("memory: %v %v", memory, err)
	}
	for prefix, want := range map[string]int{"op": 1, "nope": 0} {
		found, err := client.Search(ctx, &engramv1.SearchRequest{
			Query: "checklist", Sources: []engramv1.SearchSource{engramv1.SearchSource_SEARCH_SOURCE_MEMORY}, ScopePrefix: prefix,
		})
		if err != nil || len(found) != want {
			t.Fatalf("scope prefix %q: %v %v", prefix, found, err)
		}
	}
	if _, err := client.WorkingMemory.Remember(ctx, &engramv1.RememberRequest{
		SessionId: "chat-alice", Content: "alice deploys with helm",
	}); err != nil {
		t.Fatal(err)
	}
	block, err := client.WorkingMemory.RenderMemoryBlock(ctx, &engramv1.RenderMemoryBlockRequest{
		SessionId: "chat-alice", Query: "helm",
	})
	if err != nil || !strings.Contains(block.GetMemoryBlock(), "alice deploys with helm") {
		t.Fatalf("render with a query: %v %v", block, err)
	}
	if _, err := client.Search(ctx, &engramv1.SearchRequest{Query: ""}); engram.Reason(err) != "INVALID_QUERY" {
		t.Fatalf("empty query: %v", err)
	}
	_, err = client.Search(ctx, &engramv1.SearchRequest{Query: "x", Mode: engramv1.SearchMode_SEARCH_MODE_SEMANTIC})
	if engram.Reason(err) != "EMBEDDER_NOT_CONFIGURED" {
		t.Fatalf("semantic: %v", err)
	}
}

func TestTailResumesAcrossARestart(t *testing.T) {
	dir := t.TempDir()
	first := start(t, dir, "127.0.0.1:0")
	addr := first.addr
	client := connect(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	append := func(i int) {
		t.Helper()
		_, err := client.Episodes.AppendEpisode(ctx, &engramv1.AppendEpisodeRequest{
			SessionId: "s1", App: "app", User: "u",
			Episode: &engramv1.NewEpisode{Content: value(t, float64(i))},
		}, grpc.WaitForReady(true))
		if err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
	}
	tail := client.Tail(ctx, &engramv1.TailEpisodesRequest{App: "app", Cursor: proto.Int64(0)})
	seen := make(chan float64, 10)
	go func() {
		for tail.Next() {
			seen <- tail.Episode().GetContent().GetNumberValue()
		}
		close(seen)
	}()
	for i := 0; i < 5; i++ {
		append(i)
	}
	for i := 0; i < 5; i++ {
		if got := <-seen; got != float64(i) {
			t.Fatalf("episode %d: got %v", i, got)
		}
	}
	first.stop()
	start(t, dir, addr)
	for i := 5; i < 10; i++ {
		append(i)
	}
	for i := 5; i < 10; i++ {
		select {
		case got, ok := <-seen:
			if !ok || got != float64(i) {
				t.Fatalf("episode %d after the restart: got %v (%v)", i, got, tail.Err())
			}
		case <-ctx.Done():
			t.Fatalf("the tail did not resume: %v", tail.Err())
		}
	}
	if tail.Cursor() == 0 {
		t.Fatal("the tail knows where to resume")
	}
}

func TestWatchResumesAcrossARestart(t *testing.T) {
	dir := t.TempDir()
	first := start(t, dir, "127.0.0.1:0")
	addr := first.addr
	client := connect(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	set := func(i int) {
		t.Helper()
		_, err := client.Memory.Set(ctx, &engramv1.SetRequest{
			ScopeType: ns, Scope: "watched", Key: fmt.Sprintf("k%d", i), Value: value(t, float64(i)),
		}, grpc.WaitForReady(true))
		if err != nil {
			t.Fatalf("set %d: %v", i, err)
		}
	}
	watch := client.Watch(ctx, &engramv1.WatchRequest{ScopeType: ns, Scope: "watched", FromRevision: proto.Int64(0)})
	seen := make(chan string, 10)
	go func() {
		for watch.Next() {
			seen <- watch.Change().GetKey()
		}
		close(seen)
	}()
	expect := func(i int) {
		t.Helper()
		select {
		case got, ok := <-seen:
			if want := fmt.Sprintf("k%d", i); !ok || got != want {
				t.Fatalf("change %d: got %q (%v)", i, got, watch.Err())
			}
		case <-ctx.Done():
			t.Fatalf("the watch did not resume: %v", watch.Err())
		}
	}
	for i := 0; i < 3; i++ {
		set(i)
		expect(i)
	}
	revision := watch.Revision()
	first.stop()
	start(t, dir, addr)
	for i := 3; i < 6; i++ {
		set(i)
		expect(i)
	}
	if watch.Revision() <= revision {
		t.Fatalf("the watch knows where to resume: %d after %d", watch.Revision(), revision)
	}
	cancel()
	for range seen {
	}
	if err := watch.Err(); err != nil {
		t.Fatalf("a canceled watch ends cleanly: %v", err)
	}
}

func TestTokensTenantsAndRoles(t *testing.T) {
	hash := func(token string) string {
		sum := sha256.Sum256([]byte(token))
		return hex.EncodeToString(sum[:])
	}
	tokens := hash("acme-admin") + " acme admin; " + hash("acme") + " acme; " + hash("globex") + " globex"
	srv := start(t, t.TempDir(), "127.0.0.1:0", "ENGRAM_TOKENS="+tokens)
	ctx := context.Background()
	get := &engramv1.GetRequest{ScopeType: ns, Scope: "prefs", Key: "theme"}

	_, err := connect(t, srv.addr).Memory.Get(ctx, get)
	if e, ok := engram.AsError(err); !ok || e.Code != codes.Unauthenticated || e.Reason != "TOKEN_MISSING" {
		t.Fatalf("no token: %v", err)
	}
	_, err = connect(t, srv.addr, engram.WithToken("wrong")).Memory.Get(ctx, get)
	if e, ok := engram.AsError(err); !ok || e.Code != codes.Unauthenticated || e.Reason != "TOKEN_INVALID" {
		t.Fatalf("wrong token: %v", err)
	}

	acme := connect(t, srv.addr, engram.WithToken("acme"))
	if _, err := acme.Memory.Set(ctx, &engramv1.SetRequest{
		ScopeType: ns, Scope: "prefs", Key: "theme", Value: value(t, "dark"),
	}); err != nil {
		t.Fatal(err)
	}
	if got, err := acme.Memory.Get(ctx, get); err != nil || got.GetEntry().GetValue().GetStringValue() != "dark" {
		t.Fatalf("acme reads its own: %v %v", got, err)
	}
	_, err = connect(t, srv.addr, engram.WithToken("globex")).Memory.Get(ctx, get)
	if e, ok := engram.AsError(err); !ok || e.Code != codes.NotFound {
		t.Fatalf("globex must not see acme's key: %v", err)
	}

	purge := &engramv1.PurgeRequest{ScopeType: ns, Scope: "prefs", Key: "theme"}
	_, err = acme.MemoryAdmin.Purge(ctx, purge)
	if e, ok := engram.AsError(err); !ok || e.Code != codes.PermissionDenied || e.Reason != "ADMIN_REQUIRED" {
		t.Fatalf("non-admin purge: %v", err)
	}
	purged, err := connect(t, srv.addr, engram.WithToken("acme-admin")).MemoryAdmin.Purge(ctx, purge)
	if err != nil || purged.GetVersionsDeleted() != 1 {
		t.Fatalf("admin purge: %v %v", purged, err)
	}
}

// issue makes a certificate signed by parent (self-signed when parent is
// nil) and returns it with its key, in PEM and parsed.
func issue(t *testing.T, template *x509.Certificate, parent *tls.Certificate) (certPEM, keyPEM []byte, pair tls.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	template.SerialNumber = big.NewInt(time.Now().UnixNano())
	template.NotBefore = time.Now().Add(-time.Hour)
	template.NotAfter = time.Now().Add(time.Hour)
	signer, signerKey := template, any(key)
	if parent != nil {
		signer, signerKey = parent.Leaf, parent.PrivateKey
	}
	der, err := x509.CreateCertificate(rand.Reader, template, signer, &key.PublicKey, signerKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM = pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
	pair, err = tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return certPEM, keyPEM, pair
}

func TestTLSWithClientCertificates(t *testing.T) {
	dir := t.TempDir()
	caPEM, _, ca := issue(t, &x509.Certificate{
		Subject: pkix.Name{CommonName: "test-ca"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}, nil)
	serverPEM, serverKey, _ := issue(t, &x509.Certificate{
		Subject: pkix.Name{CommonName: "server"}, DNSNames: []string{"localhost"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}, &ca)
	_, _, client := issue(t, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "agent"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, &ca)
	write := func(name string, data []byte) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	srv := start(t, dir, "127.0.0.1:0",
		"ENGRAM_TLS_CERT_FILE="+write("server.crt", serverPEM),
		"ENGRAM_TLS_KEY_FILE="+write("server.key", serverKey),
		"ENGRAM_TLS_CLIENT_CA_FILE="+write("ca.crt", caPEM))
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	set := &engramv1.SetRequest{ScopeType: ns, Scope: "tls", Key: "k", Value: value(t, "over mTLS")}

	withCert := connect(t, srv.addr, engram.WithTLS(&tls.Config{
		RootCAs: roots, ServerName: "localhost", Certificates: []tls.Certificate{client},
	}))
	if response, err := withCert.Memory.Set(ctx, set); err != nil || response.GetEntry().GetVersion() != 1 {
		t.Fatalf("set over mTLS: %v %v", response, err)
	}
	withoutCert := connect(t, srv.addr, engram.WithTLS(&tls.Config{RootCAs: roots, ServerName: "localhost"}))
	if _, err := withoutCert.Memory.Set(ctx, set); err == nil {
		t.Fatal("a client without a certificate got in")
	}
	plaintext := connect(t, srv.addr)
	if _, err := plaintext.Memory.Set(ctx, set); err == nil {
		t.Fatal("a plaintext client got in")
	}
}

// collect reads an All… iterator to its end or its first error.
func collect[Item any](items func(func(Item, error) bool)) ([]Item, error) {
	var out []Item
	for item, err := range items {
		if err != nil {
			return out, err
		}
		out = append(out, item)
	}
	return out, nil
}

func TestAllReadsEveryPage(t *testing.T) {
	srv := start(t, t.TempDir(), "127.0.0.1:0")
	client := connect(t, srv.addr)
	ctx := context.Background()
	for i := range 5 {
		for _, scope := range []string{"pages", fmt.Sprintf("scope-%d", i)} {
			if _, err := client.Memory.Set(ctx, &engramv1.SetRequest{
				ScopeType: ns, Scope: scope, Key: fmt.Sprintf("k%d", i), Value: value(t, i),
			}); err != nil {
				t.Fatal(err)
			}
		}
		session := fmt.Sprintf("p-%d", i%3)
		if _, err := client.Episodes.AppendEpisode(ctx, &engramv1.AppendEpisodeRequest{
			SessionId: session, App: "bot", User: "fay",
			Episode: &engramv1.NewEpisode{Type: "note", Content: value(t, fmt.Sprintf("note %d", i))},
		}); err != nil {
			t.Fatal(err)
		}
		if _, err := client.WorkingMemory.Remember(ctx, &engramv1.RememberRequest{
			SessionId: "p-0", Content: fmt.Sprintf("fact %d", i),
		}); err != nil {
			t.Fatal(err)
		}
		if _, err := client.WorkingMemory.CreateTask(ctx, &engramv1.CreateTaskRequest{
			SessionId: "p-0", Subject: fmt.Sprintf("task %d", i),
		}); err != nil {
			t.Fatal(err)
		}
		rule := &engramv1.ConsolidationRule{Id: fmt.Sprintf("r%d", i), Cadence: &engramv1.ConsolidationRule_EveryNEpisodes{EveryNEpisodes: 100}}
		if _, err := client.Consolidation.CreateRule(ctx, &engramv1.CreateRuleRequest{Rule: rule}); err != nil {
			t.Fatal(err)
		}
		keep := int64(0)
		if _, err := client.MemoryAdmin.Purge(ctx, &engramv1.PurgeRequest{
			ScopeType: ns, Scope: fmt.Sprintf("scope-%d", i), Key: fmt.Sprintf("k%d", i), Keep: &keep,
		}); err != nil {
			t.Fatal(err)
		}
		if _, err := client.Memory.Set(ctx, &engramv1.SetRequest{
			ScopeType: ns, Scope: "pages", Key: fmt.Sprintf("k%d", i), Value: value(t, i*10),
		}); err != nil {
			t.Fatal(err)
		}
		if _, err := client.MemoryAdmin.Purge(ctx, &engramv1.PurgeRequest{
			ScopeType: ns, Scope: "pages", Key: fmt.Sprintf("k%d", i), Keep: proto.Int64(1),
		}); err != nil {
			t.Fatal(err)
		}
	}

	// Two items a page, so that five take three calls.
	listing := &engramv1.ListRequest{ScopeType: ns, Scope: "pages", PageSize: 2}
	entries, err := collect(client.AllEntries(ctx, listing))
	if err != nil || len(entries) != 5 || entries[4].GetKey() != "k4" || entries[4].GetValue().GetNumberValue() != 40 {
		t.Fatalf("entries: %v %v", entries, err)
	}
	if listing.GetPageToken() != "" {
		t.Fatal("the caller's request was changed")
	}
	scopes, err := collect(client.AllScopes(ctx, &engramv1.ListScopesRequest{PageSize: 2}))
	if err != nil || len(scopes) != 6 || scopes[0].GetEntryCount() != 5 ||
		scopes[5].GetScope() != "scope-4" || scopes[5].GetEntryCount() != 0 {
		t.Fatalf("scopes (the others purged empty, their audit records kept): %v %v", scopes, err)
	}
	records, err := collect(client.AllCompactionRecords(ctx, &engramv1.GetCompactionLogRequest{ScopeType: ns, Scope: "pages", PageSize: 2}))
	if err != nil || len(records) != 5 || records[0].GetSourceKeys()[0] != "k4" {
		t.Fatalf("audit trail, newest first: %v %v", records, err)
	}
	sessions, err := collect(client.AllSessions(ctx, &engramv1.ListSessionsRequest{User: "fay", PageSize: 2}))
	if err != nil || len(sessions) != 3 {
		t.Fatalf("sessions: %v %v", sessions, err)
	}
	episodes, err := collect(client.AllEpisodes(ctx, &engramv1.ListEpisodesRequest{SessionId: "p-0", PageSize: 1}))
	if err != nil || len(episodes) != 2 || episodes[1].GetContent().GetStringValue() != "note 3" {
		t.Fatalf("episodes: %v %v", episodes, err)
	}
	facts, err := collect(client.AllFacts(ctx, &engramv1.ListFactsRequest{User: "fay", PageSize: 2}))
	if err != nil || len(facts) != 5 {
		t.Fatalf("facts: %v %v", facts, err)
	}
	if _, err := client.Consolidation.DeleteFact(ctx, &engramv1.DeleteFactRequest{FactId: facts[0].GetId()}); err != nil {
		t.Fatalf("delete fact: %v", err)
	}
	versions, err := collect(client.AllFactVersions(ctx, &engramv1.GetFactRequest{FactId: facts[0].GetId(), PageSize: 1}))
	if err != nil || len(versions) != 2 || versions[0].GetVersion() != 1 || versions[0].GetDeleted() ||
		versions[1].GetVersion() != 2 || !versions[1].GetDeleted() {
		t.Fatalf("fact versions, oldest first, the tombstone last: %v %v", versions, err)
	}
	tasks, err := collect(client.AllTasks(ctx, &engramv1.ListTasksRequest{SessionId: "p-0", PageSize: 2}))
	if err != nil || len(tasks) != 5 || tasks[0].GetId() != "t1" || tasks[4].GetId() != "t5" {
		t.Fatalf("tasks, in creation order: %v %v", tasks, err)
	}
	rules, err := collect(client.AllRules(ctx, &engramv1.ListRulesRequest{PageSize: 2}))
	if err != nil || len(rules) != 5 {
		t.Fatalf("rules: %v %v", rules, err)
	}

	// Breaking out stops the iteration; a bad request yields its error once.
	seen := 0
	for range client.AllEntries(ctx, listing) {
		seen++
		break
	}
	if seen != 1 {
		t.Fatalf("break: %d", seen)
	}
	calls := 0
	for _, err := range client.AllEntries(ctx, &engramv1.ListRequest{ScopeType: ns, Scope: "pages", PageSize: -1}) {
		calls++
		if e, ok := engram.AsError(err); !ok || e.Code != codes.InvalidArgument || e.Fields["page_size"] == "" {
			t.Fatalf("negative page size: %v", err)
		}
	}
	if calls != 1 {
		t.Fatalf("the error was yielded %d times", calls)
	}
}
