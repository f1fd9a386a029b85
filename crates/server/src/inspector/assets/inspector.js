// The ctxbroker inspector's one script: on a session's page it follows the
// session's markers as server-sent events, adds each new one to the
// timeline and reads the window's numbers again. Text is only ever set
// with textContent, never parsed as markup.
"use strict";

(function () {
  const root = document.getElementById("session");
  if (!root || typeof EventSource === "undefined") {
    return;
  }
  const status = document.getElementById("live-status");
  const tbody = document.querySelector("#markers tbody");
  const stale = document.getElementById("spans-stale");
  let newest = Number(root.dataset.nextSeq) - 1;

  function say(text, on) {
    status.textContent = text;
    status.classList.toggle("on", Boolean(on));
  }

  function when(ms) {
    if (!ms) {
      return "never";
    }
    return new Date(ms).toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
  }

  function cell(row, text, numeric) {
    const td = document.createElement("td");
    td.textContent = text;
    if (numeric) {
      td.className = "num";
    }
    row.appendChild(td);
    return td;
  }

  function addMarker(m) {
    if (document.getElementById("marker-" + m.seq)) {
      return;
    }
    const empty = document.getElementById("no-markers");
    if (empty) {
      empty.remove();
    }
    const aborted = m.outcome === "aborted";
    const row = document.createElement("tr");
    row.id = "marker-" + m.seq;
    row.className = "marker fresh " + (aborted ? "aborted" : "committed");
    row.dataset.seq = String(m.seq);
    cell(row, m.seq + " (#" + m.session_seq + ")", true);
    cell(row, String(m.turn), true);
    cell(row, when(m.at_ms), false);
    cell(row, m.trigger, false);
    cell(row, aborted ? "\u26a0 aborted" : "committed", false).className = "outcome";
    cell(row, m.tokens_before + " \u2192 " + m.tokens_after, true);
    let evicted = String(m.evicted.length);
    if (m.tier_evicted.length > 0) {
      evicted += " (" + m.tier_evicted.length + " standing)";
    }
    cell(row, evicted, true);
    cell(row, m.anchors_carried + " / " + m.anchors_dropped, true);
    const detail = cell(row, m.detail, false);
    if (m.violations.length > 0) {
      const list = document.createElement("ul");
      list.className = "violations";
      for (const v of m.violations) {
        const item = document.createElement("li");
        const kind = document.createElement("strong");
        kind.textContent = v.kind;
        item.appendChild(kind);
        item.appendChild(document.createTextNode(": " + v.detail));
        list.appendChild(item);
      }
      detail.appendChild(list);
    }
    // Newest first: above every row of a lower sequence.
    let before = null;
    for (const other of tbody.querySelectorAll("tr.marker")) {
      if (Number(other.dataset.seq) < m.seq) {
        before = other;
        break;
      }
    }
    tbody.insertBefore(row, before);
    newest = Math.max(newest, m.seq);
  }

  function set(id, value) {
    const el = document.getElementById(id);
    if (el) {
      el.textContent = String(value);
    }
  }

  function share(tokens, windowTokens) {
    return windowTokens ? (tokens * 100 / windowTokens).toFixed(1) + " %" : "\u2013";
  }

  async function refresh() {
    const url = root.dataset.jsonUrl + "&limit=1";
    const response = await fetch(url, { credentials: "same-origin", cache: "no-store" });
    if (!response.ok) {
      return;
    }
    const view = await response.json();
    const w = view.window;
    const s = view.session;
    set("live-tokens", w.live_tokens);
    set("budget-tokens", w.budget_tokens);
    set("soft-watermark-tokens", w.soft_watermark_tokens);
    set("window-tokens", w.window_tokens);
    set("turns", s.turns);
    set("revision", s.revision);
    set("compactions", s.compactions);
    let x = 0;
    for (const c of w.classes) {
      const row = document.querySelector('#window-numbers tr[data-class="' + c.class + '"]');
      if (row) {
        row.querySelector('[data-field="tokens"]').textContent = String(c.tokens);
        row.querySelector('[data-field="spans"]').textContent = String(c.spans);
        row.querySelector('[data-field="share"]').textContent = share(c.tokens, w.window_tokens);
      }
      const bar = document.getElementById("bar-" + c.class);
      const len = w.window_tokens ? Math.min(1000, c.tokens / w.window_tokens * 1000) : 0;
      if (bar) {
        bar.setAttribute("x", x.toFixed(2));
        bar.setAttribute("width", len.toFixed(2));
      }
      x += len;
    }
    root.dataset.liveTokens = String(w.live_tokens);
  }

  const source = new EventSource(root.dataset.eventsUrl);
  source.addEventListener("open", function () {
    say("Live: new markers appear here as they are committed.", true);
  });
  source.addEventListener("marker", function (event) {
    addMarker(JSON.parse(event.data));
    if (stale) {
      stale.hidden = false;
    }
    say("Live: marker " + newest + " arrived; the window's numbers are up to date.", true);
    refresh().catch(function () {
      say("Live: the window's numbers could not be read again; reload the page.", false);
    });
  });
  source.addEventListener("gap", function () {
    source.close();
    say("Markers were removed by retention before they were shown: reload the page.", false);
  });
  source.addEventListener("end", function (event) {
    source.close();
    say("Live updates stopped: " + event.data + " Reload the page.", false);
  });
  source.addEventListener("error", function () {
    if (source.readyState === EventSource.CLOSED) {
      say("Live updates stopped; reload the page.", false);
    } else {
      say("Live: reconnecting\u2026", false);
    }
  });
})();
