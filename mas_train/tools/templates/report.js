// mas-report: the episode browser and the side-by-side evaluation view. Plain DOM, no framework.
// All model and env text reaches the page through textContent / Text nodes only (never innerHTML): it is
// untrusted, and a completion holding a script element must show as text.
(function () {
  "use strict";
  const PAGE = 50;
  // agent colours: none of them the green / red of the success and failure badges
  const PALETTE = ["#1f6fb4", "#8e44ad", "#00838f", "#d35400", "#7f5539", "#c2185b", "#2e4053", "#9a7d0a"];

  function el(tag, cls, ...children) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    for (const c of children) {
      if (c === null || c === undefined || c === false) continue;
      e.append(c instanceof Node ? c : String(c));
    }
    return e;
  }
  function num(v, digits) {
    if (v === null || v === undefined) return "–";
    return String(Number(Number(v).toFixed(digits === undefined ? 3 : digits)));
  }
  function signed(v) {
    if (v === null || v === undefined) return "–";
    return (v > 0 ? "+" : v < 0 ? "−" : "") + Math.abs(v).toFixed(3);
  }
  function badge(ok, yes, no) {
    return el("span", "badge " + (ok ? "ok" : "bad"), ok ? yes || "success" : no || "failure");
  }

  let data;
  try {
    data = JSON.parse(document.getElementById("report-data").textContent);
  } catch (err) {
    showError("the report's data could not be read: " + err);
    return;
  }
  function showError(msg) {
    const box = document.getElementById("js-error");
    box.hidden = false;
    box.textContent = "Report script error: " + msg;
  }
  window.addEventListener("error", (e) => showError(e.message));

  const colour = {};
  data.agents.forEach((a, i) => (colour[a] = PALETTE[i % PALETTE.length]));
  const multi = data.runs.length > 1;
  const all = [];
  data.runs.forEach((run, ri) => run.episodes.forEach((ep) => all.push({ run: ri, ep: ep })));

  function stepLabel(ep) {
    return (ep.kind === "eval" ? "evaluation at step " : "training step ") + ep.step;
  }

  // ---- one episode as a conversation ----------------------------------------------------------------
  function promptView(ep, turn) {
    const box = el("details", "prompt");
    const tokens = turn.prompt_tokens === null ? "" : ", " + turn.prompt_tokens + " tokens";
    box.append(el("summary", null, "prompt: " + turn.prompt.length + " messages" + tokens));
    box.addEventListener("toggle", function once() {
      box.removeEventListener("toggle", once);
      for (const i of turn.prompt) {
        const m = ep.messages[i];
        box.append(el("div", "msg msg-" + m.role, el("span", "role", m.role), el("pre", "text", m.content)));
      }
    });
    return box;
  }

  function turnView(ep, t, opts) {
    if (t.speaker === "env") {
      return el("div", "turn env", el("div", "turn-head", el("span", "agent", "env"), " tool result · turn " + t.turn),
        el("pre", "text", t.text));
    }
    const box = el("div", "turn");
    box.style.setProperty("--agent", colour[t.speaker] || "#555");
    if (opts.agent && opts.agent !== t.speaker) box.classList.add("dim");
    const head = el("div", "turn-head", el("span", "agent", t.speaker), " turn " + t.turn);
    if (t.model_group && !opts.compact) head.append(" · group " + t.model_group);
    if (t.completion_tokens !== null) {
      const why = t.finish_reason === "length" ? "cut at max_new_tokens" : t.finish_reason === "stop" ? "stopped" : t.finish_reason;
      head.append(" · " + t.completion_tokens + " tokens, " + why);
    }
    head.append(" · score ", el("b", null, num(t.score)));
    if (t.advantage !== null) head.append(" · advantage ", el("b", "adv", signed(t.advantage)));
    if (t.logprob_sum !== null && !opts.compact) head.append(" · logprob sum " + num(t.logprob_sum, 2));
    if (t.invalid) head.append(" ", el("span", "badge bad", "invalid"));
    if (t.skipped) head.append(" ", el("span", "badge warn", "skipped: prompt too long"));
    box.append(head, el("pre", "text", t.text === "" ? "(empty)" : t.text));
    if (!opts.compact && t.prompt.length) box.append(promptView(ep, t));
    return box;
  }

  function episodeBody(ep, opts) {
    const body = el("div", "episode-body");
    if (!opts.compact) {
      body.append(el("div", "task", el("div", "label", "question"), el("pre", "text", ep.question),
        el("div", "label", "gold answer"), el("pre", "text gold", typeof ep.gold === "string" ? ep.gold : JSON.stringify(ep.gold))));
    }
    for (const t of ep.transcript) body.append(turnView(ep, t, opts));
    const foot = el("div", "foot", "team reward ", el("b", null, num(ep.team_reward)), " · ", badge(ep.success));
    const g = ep.task_group;
    if (g && !opts.compact) foot.append(" · " + g.successes + " of the task's " + g.size + " episodes succeeded (mean reward " + num(g.mean_reward) + ")");
    const mk = Object.keys(ep.metrics || {});
    if (mk.length) foot.append(el("div", "metrics", mk.map((k) => k + " " + num(ep.metrics[k])).join(" · ")));
    body.append(foot);
    return body;
  }

  function episodeCard(item, opts) {
    const ep = item.ep;
    const card = el("details", "episode");
    card.dataset.kind = ep.kind;
    card.dataset.step = ep.step;
    card.dataset.success = ep.success;
    const sum = el("summary", null, badge(ep.success), " ",
      el("span", "where", (multi ? data.runs[item.run].name + " · " : "") + stepLabel(ep)),
      " · task " + ep.task_id + " · " + ep.data_source + " · episode " + (ep.sample + 1) + " of " + (ep.task_group ? ep.task_group.size : "?") +
      " · R = " + num(ep.team_reward),
      el("span", "q", ep.question.length > 110 ? ep.question.slice(0, 110) + "…" : ep.question));
    card.append(sum);
    card.addEventListener("toggle", function once() {
      card.removeEventListener("toggle", once);
      card.append(episodeBody(ep, opts));
    });
    return card;
  }

  // ---- filters ------------------------------------------------------------------------------------------
  function fill(select, options) {
    for (const [value, label] of options) {
      const o = el("option", null, label);
      o.value = value;
      select.append(o);
    }
  }
  const f = {
    run: document.getElementById("f-run"),
    step: document.getElementById("f-step"),
    agent: document.getElementById("f-agent"),
    outcome: document.getElementById("f-outcome"),
    source: document.getElementById("f-source"),
    text: document.getElementById("f-text"),
  };
  if (f.run) fill(f.run, [["", "all"], ...data.runs.map((r, i) => [String(i), r.name])]);
  const steps = [...new Set(all.map((x) => x.ep.kind + ":" + x.ep.step))].sort((a, b) => {
    const [ka, sa] = a.split(":"), [kb, sb] = b.split(":");
    return ka === kb ? Number(sa) - Number(sb) : ka === "eval" ? -1 : 1;
  });
  fill(f.step, [["", "all"], ["train", "all training steps"], ["eval", "all evaluations"],
    ...steps.map((s) => [s, (s.startsWith("eval") ? "evaluation at step " : "training step ") + s.split(":")[1]])]);
  fill(f.agent, [["", "all"], ...data.agents.map((a) => [a, a])]);
  fill(f.source, [["", "all"], ...[...new Set(all.map((x) => x.ep.data_source))].sort().map((s) => [s, s])]);

  function matches(item) {
    const ep = item.ep;
    if (f.run && f.run.value !== "" && String(item.run) !== f.run.value) return false;
    const s = f.step.value;
    if (s === "train" || s === "eval") {
      if (ep.kind !== s) return false;
    } else if (s !== "" && ep.kind + ":" + ep.step !== s) return false;
    if (f.agent.value && !ep.transcript.some((t) => t.speaker === f.agent.value)) return false;
    const o = f.outcome.value;
    if (o === "success" && !ep.success) return false;
    if (o === "failure" && ep.success) return false;
    if (o === "invalid" && !ep.transcript.some((t) => t.invalid)) return false;
    if (f.source.value && ep.data_source !== f.source.value) return false;
    const q = f.text.value.trim().toLowerCase();
    if (q && !(ep.question.toLowerCase().includes(q) || ep.transcript.some((t) => t.text.toLowerCase().includes(q)))) return false;
    return true;
  }

  const list = document.getElementById("episode-list");
  const more = document.getElementById("more");
  const count = document.getElementById("count");
  let shown = [];
  let upto = 0;
  function showMore() {
    const opts = { agent: f.agent.value, compact: false };
    for (const item of shown.slice(upto, upto + PAGE)) list.append(episodeCard(item, opts));
    upto = Math.min(shown.length, upto + PAGE);
    more.hidden = upto >= shown.length;
    more.textContent = "show " + Math.min(PAGE, shown.length - upto) + " more (" + (shown.length - upto) + " left)";
  }
  function refresh() {
    shown = all.filter(matches);
    list.replaceChildren();
    upto = 0;
    count.textContent = all.length
      ? shown.length + " of " + all.length + " episodes"
      : "No episodes were logged (log_episodes and log_eval_episodes 0, or a run from before episode logging).";
    count.dataset.shown = shown.length;
    showMore();
  }
  for (const key of ["run", "step", "agent", "outcome", "source"]) if (f[key]) f[key].addEventListener("change", refresh);
  f.text.addEventListener("input", refresh);
  more.addEventListener("click", showMore);
  refresh();

  // ---- side by side -------------------------------------------------------------------------------------
  function compareView() {
    const host = document.getElementById("compare-body");
    const cols = data.columns;
    if (cols.length < 2) {
      host.append(el("p", "muted", cols.length
        ? "Only one evaluation logged its episodes; a second one (eval_steps, or the end of the run) gives the comparison."
        : "No evaluation episodes were logged (log_eval_episodes: 0, or evaluation off)."));
      return;
    }
    const maps = cols.map((c) => {
      const m = new Map();
      for (const x of all) if (x.run === c.run && x.ep.kind === "eval" && x.ep.step === c.step) m.set(x.ep.task_id + "#" + x.ep.sample, x.ep);
      return m;
    });
    const keys = [...new Set(maps.flatMap((m) => [...m.keys()]))];
    // per column: successes, mean reward, invalid turns per agent, env metric means over the shown episodes
    const head = el("div", "cmp-grid cmp-head");
    head.style.setProperty("--cols", cols.length);
    cols.forEach((c, i) => {
      const eps = [...maps[i].values()];
      const ok = eps.filter((e) => e.success).length;
      const cell = el("div", "cmp-cell", el("h3", null, c.label),
        el("div", null, "success ", el("b", null, ok + " / " + eps.length), " · mean reward " + num(eps.reduce((a, e) => a + (e.team_reward || 0), 0) / Math.max(1, eps.length))));
      const inv = {};
      const metr = {};
      for (const e of eps) {
        for (const t of e.transcript) if (t.speaker !== "env") {
          inv[t.speaker] = inv[t.speaker] || [0, 0];
          inv[t.speaker][0] += t.invalid ? 1 : 0;
          inv[t.speaker][1] += 1;
        }
        for (const [k, v] of Object.entries(e.metrics || {})) if (v !== null) {
          metr[k] = metr[k] || [0, 0];
          metr[k][0] += v;
          metr[k][1] += 1;
        }
      }
      cell.append(el("div", "muted", Object.entries(inv).map(([a, [n, d]]) => a + " invalid " + n + "/" + d).join(" · ")));
      if (Object.keys(metr).length) cell.append(el("div", "muted", Object.entries(metr).map(([k, [s, n]]) => k + " " + num(s / n)).join(" · ")));
      head.append(cell);
    });
    const ctl = el("label", null, "show ");
    const sel = el("select");
    sel.id = "cmp-filter";
    fill(sel, [["", "all tasks"], ["changed", "tasks whose outcome changed"], ["better", "tasks that went from failure to success"], ["worse", "tasks that went from success to failure"]]);
    ctl.append(sel);
    const cnt = el("span", "count");
    cnt.id = "cmp-count";
    const rows = el("div", "cmp-rows");
    host.append(el("div", "filters", ctl, " ", cnt), head, rows);
    function draw() {
      rows.replaceChildren();
      let n = 0;
      for (const key of keys) {
        const eps = maps.map((m) => m.get(key));
        const first = eps[0], last = eps[eps.length - 1];
        const a = first ? first.success : null, b = last ? last.success : null;
        const v = sel.value;
        if (v === "changed" && a === b) continue;
        if (v === "better" && !(a === false && b === true)) continue;
        if (v === "worse" && !(a === true && b === false)) continue;
        n += 1;
        const any = eps.find((e) => e);
        const row = el("div", "cmp-row");
        row.dataset.task = any.task_id;
        row.append(el("div", "cmp-task", el("b", null, "task " + any.task_id), " · " + any.data_source + " · gold ",
          el("code", null, typeof any.gold === "string" ? any.gold : JSON.stringify(any.gold)), el("pre", "text", any.question)));
        const grid = el("div", "cmp-grid");
        grid.style.setProperty("--cols", cols.length);
        eps.forEach((e, i) => {
          const cell = el("div", "cmp-cell", el("div", "cmp-label", cols[i].label));
          if (!e) cell.append(el("p", "muted", "not logged in this evaluation"));
          else {
            cell.dataset.success = e.success;
            cell.append(episodeBody(e, { compact: true }));
          }
          grid.append(cell);
        });
        row.append(grid);
        rows.append(row);
      }
      cnt.textContent = n + " of " + keys.length + " tasks";
      cnt.dataset.shown = n;
    }
    sel.addEventListener("change", draw);
    draw();
  }
  compareView();
  document.body.dataset.ready = "1";
})();
