// The live tail of a session page: new episodes arrive as server-sent
// events, already rendered as table rows by the server (escaped there),
// and are appended below the last one. The browser's EventSource sends the
// last event id when it reconnects, so the tail resumes where it was. The
// session's episode count above counts them in as they arrive.
(function () {
  "use strict";
  var body = document.getElementById("episodes");
  if (!body || body.dataset.live !== "true") { return; }
  var status = document.getElementById("live");
  var count = document.getElementById("episode-count");
  var url = "/ui/session/tail?id=" + encodeURIComponent(body.dataset.session) +
    "&cursor=" + encodeURIComponent(body.dataset.cursor);
  var source = new EventSource(url);
  source.addEventListener("open", function () {
    if (status) { status.textContent = "Live: new episodes appear as they are appended."; }
  });
  source.addEventListener("error", function () {
    if (status) { status.textContent = "Reconnecting…"; }
  });
  source.addEventListener("episode", function (event) {
    var rows = document.createElement("tbody");
    rows.innerHTML = event.data;
    while (rows.firstChild) {
      var row = rows.firstChild;
      rows.removeChild(row);
      if (row.id && document.getElementById(row.id)) { continue; }
      body.appendChild(row);
      // The session's count as of the page, plus each episode since.
      if (count && row.nodeName === "TR") { count.textContent = String(Number(count.textContent) + 1); }
    }
  });
}());
