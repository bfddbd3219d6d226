// The inbox pages' behaviour, without a framework and without inline scripts.
//
// Live updates: every second, ask /api/v1/changes whether the ledger moved past the
// cursor this page was rendered at; if it did, fetch this page again and swap the
// regions marked data-live whose server HTML changed (keeping what the person selected).
// Also: local and relative times, countdowns, keyboard shortcuts (? lists them), the
// waiting list's search and selection, and a denial that cannot go without a reason.
// Everything works without this script too; it only makes the pages faster to work.
(function () {
  "use strict";

  var POLL_MS = 1000;
  var body = document.body;
  var page = body.dataset.page || "other";
  var cursor = body.dataset.cursor || "0";
  var served = {}; // data-live name -> the HTML the server last sent for it
  var deadlines = new WeakMap(); // countdown element -> Date.now() at its deadline

  function $(selector, root) { return (root || document).querySelector(selector); }
  function all(selector, root) { return Array.prototype.slice.call((root || document).querySelectorAll(selector)); }

  function remember(root) {
    all("[data-live]", root).forEach(function (el) { served[el.dataset.live] = el.innerHTML; });
  }

  // -- time ------------------------------------------------------------------------

  function pad(n) { return (n < 10 ? "0" : "") + n; }

  function duration(seconds) {
    var s = Math.max(0, Math.floor(seconds));
    if (s >= 86400) return Math.floor(s / 86400) + "d" + pad(Math.floor((s % 86400) / 3600)) + "h";
    if (s >= 3600) return Math.floor(s / 3600) + "h" + pad(Math.floor((s % 3600) / 60)) + "m";
    if (s >= 60) return Math.floor(s / 60) + "m" + pad(s % 60) + "s";
    return s + "s";
  }

  function relative(ms) {
    var s = Math.round(Math.abs(ms) / 1000);
    var words = s < 45 ? "just now"
      : s < 3600 ? Math.round(s / 60) + " min"
      : s < 86400 ? Math.round(s / 3600) + " h"
      : Math.round(s / 86400) + " d";
    if (words === "just now") return words;
    return ms < 0 ? "in " + words : words + " ago";
  }

  function local(date) {
    return date.getFullYear() + "-" + pad(date.getMonth() + 1) + "-" + pad(date.getDate()) +
      " " + pad(date.getHours()) + ":" + pad(date.getMinutes()) + ":" + pad(date.getSeconds());
  }

  function times() {
    all("time.t[datetime]").forEach(function (el) {
      var iso = el.getAttribute("datetime");
      var date = iso ? new Date(iso) : null;
      if (!date || isNaN(date.getTime())) return;
      el.textContent = local(date) + " (" + relative(Date.now() - date.getTime()) + ")";
      el.title = iso + " (UTC)";
    });
  }

  function tick() {
    all(".countdown[data-left]").forEach(function (el) {
      var left = parseFloat(el.dataset.left);
      if (isNaN(left)) return;
      if (!deadlines.has(el)) deadlines.set(el, Date.now() + left * 1000);
      var ms = deadlines.get(el) - Date.now();
      el.textContent = ms > 0 ? "in " + duration(ms / 1000) : "now (the broker applies the deadline)";
      el.classList.toggle("soon", ms < 5 * 60 * 1000);
    });
    times();
  }

  // -- live updates -----------------------------------------------------------------

  function banner(text) {
    var el = document.getElementById("banner");
    if (!el) return;
    el.textContent = text;
    el.hidden = !text;
  }

  function live(state) {
    var el = document.getElementById("live");
    if (el) el.dataset.state = state;
  }

  function refresh(latest) {
    var picked = selection().map(function (box) { return box.value; });
    var peeking = all("details.peek[open]").map(function (el) { return el.dataset.ref; });
    var current = currentRef();
    return fetch(body.dataset.liveUrl, {
      credentials: "same-origin",
      cache: "no-store",
      headers: { Accept: "text/html" },
    }).then(function (res) {
      if (res.redirected && new URL(res.url).pathname === "/login") {
        throw new Error("signed out");
      }
      if (res.status === 404) return null;
      // any other failure: keep the cursor, so the next poll fetches the page again
      if (!res.ok) throw new Error("HTTP " + res.status);
      return res.text();
    }).then(function (html) {
      if (html === null) { // this page is gone (a 404): keep what is shown
        cursor = latest;
        return;
      }
      var fresh = new DOMParser().parseFromString(html, "text/html");
      all("[data-live]").forEach(function (current) {
        var name = current.dataset.live;
        var el = fresh.querySelector('[data-live="' + CSS.escape(name) + '"]');
        var now = el ? el.innerHTML : "";
        if (served[name] === now) return;
        served[name] = now;
        if (el) current.replaceWith(document.importNode(el, true));
        else current.replaceChildren();
      });
      document.title = fresh.title;
      cursor = fresh.body.dataset.cursor || cursor;
      all("input[name=pick]").forEach(function (box) { box.checked = picked.indexOf(box.value) >= 0; });
      all("details.peek").forEach(function (el) { if (peeking.indexOf(el.dataset.ref) >= 0) el.open = true; });
      filterList();
      if (current) setCurrent(itemByRef(current), false);
      counted();
      tick();
    });
  }

  function poll() {
    fetch("/api/v1/changes?since=" + encodeURIComponent(cursor), {
      credentials: "same-origin",
      cache: "no-store",
    }).then(function (res) {
      if (res.status === 401) throw new Error("signed out");
      if (!res.ok) throw new Error("HTTP " + res.status);
      return res.json();
    }).then(function (data) {
      live("on");
      banner("");
      return data.changed ? refresh(String(data.cursor)) : null;
    }).then(function () {
      setTimeout(poll, POLL_MS);
    }).catch(function (err) {
      if (String(err && err.message) === "signed out") {
        live("off");
        banner("Your session ended: reload the page to sign in again.");
        return;
      }
      live("off");
      banner("The broker does not answer; retrying…");
      setTimeout(poll, POLL_MS * 3);
    });
  }

  // -- the waiting list: search, current item, selection ------------------------------

  function items() { return all("#items > .item"); }
  function visibleItems() { return items().filter(function (el) { return !el.hidden; }); }
  function selection() { return all("input[name=pick]").filter(function (box) { return box.checked && !box.disabled; }); }
  function itemByRef(ref) { return items().filter(function (el) { return el.dataset.ref === ref; })[0] || null; }
  function currentRef() { var el = $("#items > .item.current"); return el ? el.dataset.ref : null; }

  function setCurrent(el, scroll) {
    items().forEach(function (other) { other.classList.toggle("current", other === el); });
    if (el && scroll !== false) {
      el.scrollIntoView({ block: "nearest" });
      var link = $("a.ref", el);
      if (link) link.focus({ preventScroll: true });
    }
  }

  function filterList() {
    var box = $("#q");
    if (!box || page !== "list") return;
    var needle = box.value.trim().toLowerCase();
    items().forEach(function (el) {
      var hide = needle !== "" && el.textContent.toLowerCase().indexOf(needle) < 0;
      el.hidden = hide;
      var pick = $("input[name=pick]", el);
      if (pick) pick.disabled = hide; // a hidden request is never part of a batch
    });
    var current = $("#items > .item.current");
    if (current && current.hidden) setCurrent(null, false);
  }

  function searched() {
    filterList();
    counted();
    var form = $("#filters");
    if (!form) return;
    var query = new URLSearchParams(new FormData(form));
    all("select, input", form).forEach(function (el) { if (!el.value) query.delete(el.name); });
    var url = "/" + (query.toString() ? "?" + query.toString() : "");
    history.replaceState(null, "", url);
    body.dataset.liveUrl = url;
  }

  function counted() {
    var bar = $("#batch-bar");
    if (!bar) return;
    var n = selection().length;
    var choosable = all("input[name=pick]").length > 0;
    bar.hidden = !choosable;
    $("#selected-count").textContent = n
      ? n + " selected: each gets its own decision, bound to the sha256 you see"
      : "select requests (x) to decide them together";
    $("#batch-approve").disabled = n === 0;
    $("#batch-deny").disabled = n === 0;
    $("#batch-approve").textContent = n ? "Approve " + n + " selected" : "Approve selected";
    $("#batch-deny").textContent = n ? "Deny " + n + " selected" : "Deny selected";
  }

  function move(step) {
    if (page === "request") {
      var link = $(step > 0 ? "#next-request" : "#prev-request");
      if (link) link.click();
      return;
    }
    var list = visibleItems();
    if (!list.length) return;
    var at = list.indexOf($("#items > .item.current"));
    var next = at < 0 ? (step > 0 ? 0 : list.length - 1) : Math.min(list.length - 1, Math.max(0, at + step));
    setCurrent(list[next]);
  }

  function current() {
    var el = $("#items > .item.current");
    return el && !el.hidden ? el : null;
  }

  function toggle(el) {
    var box = el && $("input[name=pick]", el);
    if (box && !box.disabled) { box.checked = !box.checked; counted(); }
  }

  // -- deciding -----------------------------------------------------------------------

  function decisionForm(el) {
    var form = el && (el.form || (el.closest && el.closest("form")));
    return form && (form.id === "decide" || form.id === "batch") ? form : null;
  }

  function onSubmit(event) {
    // A denial without a reason is refused by the broker: say so before posting.
    var form = decisionForm(event.target);
    if (!form) return;
    var reason = form.querySelector("textarea[name=reason]");
    var verdict = event.submitter && event.submitter.value;
    if (verdict === "approve" && unreadApproval(form)) { event.preventDefault(); return; }
    reason.setCustomValidity("");
    if (verdict === "deny" && !reason.value.trim()) {
      event.preventDefault();
      reason.setCustomValidity("A denial needs a reason: the agent reads it, so say what to do instead.");
      reason.reportValidity();
      reason.focus();
    }
  }

  // An irreversible request approved from the keyboard before its content was scrolled
  // through asks once more: a second Enter approves it.
  var readToEnd = false;

  function watchReading() {
    var end = $("#preview-end");
    if (!end || !("IntersectionObserver" in window)) { readToEnd = true; return; }
    new IntersectionObserver(function (entries, observer) {
      if (entries.some(function (e) { return e.isIntersecting; })) { readToEnd = true; observer.disconnect(); }
    }).observe(end);
  }

  function unreadApproval(form) {
    if (form.id !== "decide" || !form.dataset.keyboard || form.dataset.confirmed) return false;
    var end = $("#preview-end");
    if (readToEnd || !end || end.getBoundingClientRect().top < window.innerHeight) return false;
    if (!$(".meta .marker-irreversible")) return false;
    form.dataset.confirmed = "yes";
    var ask = document.createElement("p");
    ask.className = "problem confirm-unread";
    ask.id = "confirm-unread";
    ask.setAttribute("role", "alert");
    ask.textContent = "This cannot be undone and you have not scrolled to the end of its content. " +
      "Press Enter again to approve it anyway, or read it first.";
    form.insertBefore(ask, form.querySelector(".controls"));
    var button = form.querySelector("#approve");
    if (button) button.focus();
    return true;
  }

  function onReasonKey(event) {
    // Ctrl+Enter in the reason box confirms the verdict chosen with a or d.
    var form = decisionForm(event.target);
    if (!form || event.target.name !== "reason") return false;
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey) && form.dataset.mode) {
      event.preventDefault();
      var button = form.querySelector('button[value="' + form.dataset.mode + '"]');
      if (button && !button.disabled) form.requestSubmit(button);
      return true;
    }
    return false;
  }

  function decideKey(verdict) {
    var form = page === "list" ? $("#batch") : $("#decide");
    if (!form) return;
    if (page === "list" && !selection().length) {
      var el = current();
      if (el && $("input[name=pick]", el)) toggle(el);
      else if (el) { $("a.ref", el).click(); return; } // its rule wants it decided alone
      else return;
    }
    form.dataset.mode = verdict;
    form.dataset.keyboard = "yes";
    var reason = $(page === "list" ? "#batch-reason" : "#reason");
    var button = $(page === "list" ? "#batch-" + verdict : "#" + verdict);
    if (verdict === "deny" && reason && !reason.value.trim()) reason.focus();
    else if (button) button.focus();
  }

  // -- keys ---------------------------------------------------------------------------

  function typing(target) {
    if (!target) return false;
    if (target.isContentEditable || /^(TEXTAREA|SELECT)$/.test(target.tagName)) return true;
    return target.tagName === "INPUT" && !/^(checkbox|radio|button|submit|reset)$/.test(target.type);
  }

  function help() {
    var dialog = $("#help");
    if (!dialog) return;
    if (dialog.open) dialog.close();
    else dialog.showModal();
  }

  function onKey(event) {
    if (onReasonKey(event)) return;
    if (event.ctrlKey || event.metaKey || event.altKey || event.defaultPrevented) return;
    if (event.key === "Escape" && typing(event.target)) { event.target.blur(); return; }
    if (typing(event.target)) return;
    var dialog = $("#help");
    if (dialog && dialog.open && event.key !== "?") return;
    var keys = {
      j: function () { move(1); },
      k: function () { move(-1); },
      x: function () { toggle(current()); },
      o: function () { var el = current(); if (el) $("a.ref", el).click(); },
      a: function () { decideKey("approve"); },
      d: function () { decideKey("deny"); },
      "/": function () { var q = $("#q"); if (q) q.focus(); },
      "?": help,
    };
    if (event.key === "Enter" && page === "list" && event.target === body) {
      keys.o();
      event.preventDefault();
      return;
    }
    var action = keys[event.key];
    if (!action) return;
    event.preventDefault();
    action();
  }

  // -- start ----------------------------------------------------------------------------

  // a batch's outcome is shown at /batch: keep the address of the list, not of the post
  if (location.pathname === "/batch" && body.dataset.liveUrl) history.replaceState(null, "", body.dataset.liveUrl);
  remember(document);
  watchReading();
  // on a phone the facts fold away under the content: one tap opens them
  var side = $("#side");
  if (side && window.matchMedia("(max-width: 900px)").matches) side.open = false;
  tick();
  setInterval(tick, 1000);
  document.addEventListener("keydown", onKey);
  var keysButton = $("#keys");
  if (keysButton) keysButton.addEventListener("click", help);
  // delegated: live updates replace the decision bar and the list
  document.addEventListener("submit", onSubmit);
  document.addEventListener("input", function (event) {
    if (event.target.name === "reason" && event.target.setCustomValidity) event.target.setCustomValidity("");
  });
  var batch = $("#batch");
  if (batch) {
    batch.addEventListener("change", function (event) {
      if (event.target.name === "pick") counted();
    });
    batch.addEventListener("click", function (event) {
      var el = event.target.closest && event.target.closest("#items > .item");
      if (el) setCurrent(el, false);
    });
  }
  all("select.auto-submit").forEach(function (select) {
    select.addEventListener("change", function () { select.form.submit(); });
  });
  var q = $("#q");
  if (q && page === "list") q.addEventListener("input", searched);
  filterList();
  counted();
  if (body.dataset.liveUrl) setTimeout(poll, POLL_MS);
})();
