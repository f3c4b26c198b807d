package engram

import (
	"context"
	"errors"
	"io"
	"iter"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"engram.dev/engram/clients/go/engramv1"
)

// The All… methods read every page of a paged call and yield its items in
// the server's order, for use with range:
//
//	for entry, err := range client.AllEntries(ctx, &engramv1.ListRequest{Scope: "prefs"}) {
//		if err != nil {
//			return err
//		}
//		use(entry)
//	}
//
// Each page is asked for with the token of the one before, starting from
// the request's own page_token; its page_size is the size of each page.
// The request is copied, never changed. A failed call yields its error
// once and ends the iteration; breaking out of the loop asks for no
// further page.

// paged is a response of a paged call.
type paged interface{ GetNextPageToken() string }

// pages yields the items of every page: call is the stub's method, items
// picks a page's items and token sets a request's page token.
func pages[Req proto.Message, Resp paged, Item any](
	ctx context.Context,
	request Req,
	token func(Req, string),
	call func(context.Context, Req, ...grpc.CallOption) (Resp, error),
	items func(Resp) []Item,
) iter.Seq2[Item, error] {
	return func(yield func(Item, error) bool) {
		next, ok := proto.Clone(request).(Req)
		if !ok {
			return // proto.Clone returns the request's own type
		}
		for {
			page, err := call(ctx, next)
			if err != nil {
				var none Item
				yield(none, err)
				return
			}
			for _, item := range items(page) {
				if !yield(item, nil) {
					return
				}
			}
			following := page.GetNextPageToken()
			if following == "" {
				return
			}
			token(next, following)
		}
	}
}

// AllEntries yields every live entry a List request matches.
func (c *Client) AllEntries(ctx context.Context, request *engramv1.ListRequest) iter.Seq2[*engramv1.MemoryEntry, error] {
	return pages(ctx, request, func(r *engramv1.ListRequest, t string) { r.PageToken = t },
		c.Memory.List, (*engramv1.ListResponse).GetEntries)
}

// AllScopes yields every scope a ListScopes request matches.
func (c *Client) AllScopes(ctx context.Context, request *engramv1.ListScopesRequest) iter.Seq2[*engramv1.ScopeSummary, error] {
	return pages(ctx, request, func(r *engramv1.ListScopesRequest, t string) { r.PageToken = t },
		c.Memory.ListScopes, (*engramv1.ListScopesResponse).GetScopes)
}

// AllCompactionRecords yields a scope's audit trail, newest first.
func (c *Client) AllCompactionRecords(ctx context.Context, request *engramv1.GetCompactionLogRequest) iter.Seq2[*engramv1.CompactionRecord, error] {
	return pages(ctx, request, func(r *engramv1.GetCompactionLogRequest, t string) { r.PageToken = t },
		c.MemoryAdmin.GetCompactionLog, (*engramv1.GetCompactionLogResponse).GetRecords)
}

// AllSessions yields every session a ListSessions request matches.
func (c *Client) AllSessions(ctx context.Context, request *engramv1.ListSessionsRequest) iter.Seq2[*engramv1.Session, error] {
	return pages(ctx, request, func(r *engramv1.ListSessionsRequest, t string) { r.PageToken = t },
		c.Sessions.ListSessions, (*engramv1.ListSessionsResponse).GetSessions)
}

// AllEpisodes yields a session's episodes that a ListEpisodes request
// matches, oldest first.
func (c *Client) AllEpisodes(ctx context.Context, request *engramv1.ListEpisodesRequest) iter.Seq2[*engramv1.Episode, error] {
	return pages(ctx, request, func(r *engramv1.ListEpisodesRequest, t string) { r.PageToken = t },
		c.Episodes.ListEpisodes, (*engramv1.ListEpisodesResponse).GetEpisodes)
}

// AllFacts yields every fact a ListFacts request matches.
func (c *Client) AllFacts(ctx context.Context, request *engramv1.ListFactsRequest) iter.Seq2[*engramv1.Fact, error] {
	return pages(ctx, request, func(r *engramv1.ListFactsRequest, t string) { r.PageToken = t },
		c.Consolidation.ListFacts, (*engramv1.ListFactsResponse).GetFacts)
}

// AllFactVersions yields every version of a fact with its lineage, oldest
// first; each page carries the fact at its newest version too.
func (c *Client) AllFactVersions(ctx context.Context, request *engramv1.GetFactRequest) iter.Seq2[*engramv1.FactVersion, error] {
	return pages(ctx, request, func(r *engramv1.GetFactRequest, t string) { r.PageToken = t },
		c.Consolidation.GetFact, (*engramv1.GetFactResponse).GetVersions)
}

// AllTasks yields a session's tasks, in creation order.
func (c *Client) AllTasks(ctx context.Context, request *engramv1.ListTasksRequest) iter.Seq2[*engramv1.Task, error] {
	return pages(ctx, request, func(r *engramv1.ListTasksRequest, t string) { r.PageToken = t },
		c.WorkingMemory.ListTasks, (*engramv1.ListTasksResponse).GetTasks)
}

// AllRules yields every consolidation rule of the tenant.
func (c *Client) AllRules(ctx context.Context, request *engramv1.ListRulesRequest) iter.Seq2[*engramv1.ConsolidationRule, error] {
	return pages(ctx, request, func(r *engramv1.ListRulesRequest, t string) { r.PageToken = t },
		c.Consolidation.ListRules, (*engramv1.ListRulesResponse).GetRules)
}

// AllVersions yields every version of a key a History request asks for,
// oldest first, tombstones included. A stream that breaks (a database
// failover, a server restart) is asked again from the version after the
// last one yielded, as WithRetries retries a read (counting breaks in a
// row), so no version is missed or repeated. The request is copied, never
// changed; breaking out of the loop ends the stream.
func (c *Client) AllVersions(ctx context.Context, request *engramv1.HistoryRequest) iter.Seq2[*engramv1.MemoryEntry, error] {
	return func(yield func(*engramv1.MemoryEntry, error) bool) {
		next, ok := proto.Clone(request).(*engramv1.HistoryRequest)
		if !ok {
			return // proto.Clone returns the request's own type
		}
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		tries := newRetrier(c.options, engramv1.MemoryService_History_FullMethodName, next)
		for {
			// After a failure, wait for the server to be reachable again.
			stream, err := c.Memory.History(ctx, next, grpc.WaitForReady(tries.failed > 0))
			for err == nil {
				var response *engramv1.HistoryResponse
				if response, err = stream.Recv(); err == nil {
					next.FromVersion = response.GetEntry().GetVersion() + 1
					tries.progressed()
					if !yield(response.GetEntry(), nil) {
						return
					}
				}
			}
			if errors.Is(err, io.EOF) {
				return
			}
			if !tries.again(ctx, err) {
				yield(nil, tries.final(err))
				return
			}
		}
	}
}
