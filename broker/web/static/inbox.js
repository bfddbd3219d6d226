// Live updates for the inbox pages, without a framework and without inline scripts.
//
// Every second, ask /api/v1/changes whether the ledger moved past the cursor this page
// was rendered at; if it did, fetch this page again and swap the regions marked
// data-live whose server HTML changed. Countdowns tick locally between fetches.
(function () {
  "use strict";

  var POLL_MS = 1000;
  var body = document.body;
  var cursor = body.dataset.cursor || "0";
  var served = {}; // data-live name -> the HTML the server last sent for it
  var deadlines = new WeakMap(); // countdown element -> Date.now() at its deadline

  function remember(root) {
    root.querySelectorAll("[data-live]").forEach(function (el) {
      served[el.dataset.live] = el.innerHTML;
    });
  }

  function duration(seconds) {
    var s = Math.max(0, Math.floor(seconds));
    var pad = function (n) { return (n < 10 ? "0" : "") + n; };
    if (s >= 86400) return Math.floor(s / 86400) + "d" + pad(Math.floor((s % 86400) / 3600)) + "h";
    if (s >= 3600) return Math.floor(s / 3600) + "h" + pad(Math.floor((s % 3600) / 60)) + "m";
    if (s >= 60) return Math.floor(s / 60) + "m" + pad(s % 60) + "s";
    return s + "s";
  }

  function tick() {
    document.querySelectorAll(".countdown[data-left]").forEach(function (el) {
      var left = parseFloat(el.dataset.left);
      if (isNaN(left)) return;
      if (!deadlines.has(el)) deadlines.set(el, Date.now() + left * 1000);
      var ms = deadlines.get(el) - Date.now();
      el.textContent = ms > 0 ? "in " + duration(ms / 1000) : "now (the broker applies the deadline)";
      el.classList.toggle("soon", ms < 5 * 60 * 1000);
    });
  }

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
    return fetch(body.dataset.liveUrl, {
      credentials: "same-origin",
      cache: "no-store",
      headers: { Accept: "text/html" },
    }).then(function (res) {
      if (res.redirected && new URL(res.url).pathname === "/login") {
        throw new Error("signed out");
      }
      return res.ok ? res.text() : null;
    }).then(function (html) {
      if (html === null) { // this page is gone (a 404): keep what is shown
        cursor = latest;
        return;
      }
      var fresh = new DOMParser().parseFromString(html, "text/html");
      document.querySelectorAll("[data-live]").forEach(function (current) {
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

  remember(document);
  tick();
  setInterval(tick, 1000);
  if (body.dataset.liveUrl) setTimeout(poll, POLL_MS);
})();
