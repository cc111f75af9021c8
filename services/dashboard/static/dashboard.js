// The dashboard's one script, served by the dashboard itself (Content-Security-Policy
// script-src 'self'; no framework, nothing from a CDN).
//
// Live pages: a page whose <body> has data-refresh-s fetches its own URL every that many
// seconds and swaps in the server-rendered fragments marked data-live (tables, SVG charts)
// whose HTML changed, so it updates without a full reload. When the session has lapsed the
// fetch is redirected to /sign-in, and so is the page.
//
// Sign-in page: the session cookie is SameSite=Strict, so a dashboard URL opened from another
// site arrives without it and lands here; a same-origin request does carry it, so ask whether
// the browser is signed in after all and, if so, go on to the page that was asked for.
"use strict";
(() => {
  const body = document.body;
  const status = document.getElementById("live-status");
  const say = (text, stale) => {
    if (status) {
      status.textContent = text;
      status.classList.toggle("stale", stale);
    }
  };
  const liveIds = (root) => [...root.querySelectorAll("[data-live]")].map((part) => part.id).join(" ");

  async function refresh() {
    const response = await fetch(location.href, {
      headers: { Accept: "text/html" },
      cache: "no-store",
      credentials: "same-origin",
    });
    if (response.redirected && new URL(response.url).pathname === "/sign-in") {
      location.assign(response.url);
      return;
    }
    const fresh = new DOMParser().parseFromString(await response.text(), "text/html");
    const main = document.querySelector("main");
    const next = fresh.querySelector("main");
    if (!main || !next) throw new Error(`HTTP ${response.status}`);
    if (liveIds(main) !== liveIds(next)) {
      main.replaceWith(document.adoptNode(next)); // sections came or went: the whole page body
    } else {
      for (const part of [...next.querySelectorAll("[data-live]")]) {
        const current = document.getElementById(part.id);
        if (current && current.innerHTML !== part.innerHTML) current.replaceWith(document.adoptNode(part));
      }
    }
    document.title = fresh.title;
    body.dataset.updates = String(Number(body.dataset.updates || "0") + 1);
    say(`updated ${new Date().toLocaleTimeString()}`, !response.ok);
  }

  const every = Number(body.dataset.refreshS || "0") * 1000;
  if (every > 0) {
    let busy = false;
    const tick = async () => {
      if (busy || document.hidden) return;
      busy = true;
      try {
        await refresh();
      } catch (error) {
        say(`not updated: ${error.message}`, true);
      } finally {
        busy = false;
      }
    };
    setInterval(tick, every);
    document.addEventListener("visibilitychange", tick);
    say("live", false);
  }

  const next = body.dataset.signedInNext;
  if (next) {
    fetch("/sign-in/status", { credentials: "same-origin", cache: "no-store" })
      .then((response) => response.json())
      .then((status) => status.signed_in && location.replace(next))
      .catch(() => {});
  }
})();
