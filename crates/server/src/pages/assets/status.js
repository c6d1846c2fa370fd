// The live status: every two seconds, read /status.json and write its
// numbers into the elements whose data-field names them, and redraw the
// charts' lines (as the server drew them: the newest sample at the right).
"use strict";
(() => {
  const HISTORY = 300, W = 600, H = 150;
  const UNITS = ["bytes", "KiB", "MiB", "GiB", "TiB"];
  const number = (v) => (Math.abs(v) < 10 && v % 1 !== 0 ? v.toFixed(1) : v.toFixed(0));
  const bytes = (v) => {
    let u = 0;
    while (v >= 1024 && u < UNITS.length - 1) { v /= 1024; u += 1; }
    return (u === 0 || v % 1 === 0 ? v.toFixed(0) : v.toFixed(1)) + " " + UNITS[u];
  };
  const formats = {
    int: (v) => String(Math.round(v)),
    rate: number,
    ratio: (v) => v.toFixed(2),
    bytes: bytes,
    target: (v) => (v > 0 ? bytes(v) : "none"),
    onoff: (v) => (v ? "on" : "off"),
    text: String,
  };
  const lookup = (doc, path) => path.split(".").reduce((o, k) => (o == null ? o : o[k]), doc);
  const points = (values, max) => {
    const step = W / (HISTORY - 1);
    const start = W - step * Math.max(values.length - 1, 0);
    return values.map((v, i) => {
      const y = H - Math.min(Math.max(v / max, 0), 1) * H;
      return (start + step * i).toFixed(1) + "," + y.toFixed(1);
    }).join(" ");
  };
  const draw = (svg, lines, max) => {
    for (const [cls, values] of lines) {
      svg.querySelector("polyline." + cls).setAttribute("points", points(values, max));
    }
  };
  let updates = 0;
  const show = (doc) => {
    const now = doc.now;
    if (!now) return;
    const h = doc.history;
    const series = (k) => h.map((s) => s[k]);
    const max = Math.max(1, ...series("events_in"), ...series("events_out"), ...series("queries"));
    now.chart_max = max;
    document.querySelectorAll("[data-field]").forEach((el) => {
      const v = lookup(now, el.dataset.field);
      if (v === undefined) return;
      el.textContent = (formats[el.dataset.format] || String)(v);
    });
    const traffic = document.getElementById("traffic");
    draw(traffic, [["in", series("events_in")], ["out", series("events_out")],
      ["queries", series("queries")]], max);
    draw(document.getElementById("throttle"), [["write", series("write_output")],
      ["read", series("read_output")]], 1);
    const meter = (id, value, max) => {
      const m = document.getElementById(id);
      m.max = Math.max(max, 1);
      m.value = value;
    };
    const s = now.store;
    meter("store-meter", s.used_bytes, Math.max(s.retention_target_bytes, s.used_bytes));
    meter("disk-meter", Math.max(s.disk_total_bytes - s.disk_free_bytes, 0), s.disk_total_bytes);
    updates += 1;
    traffic.dataset.samples = String(h.length);
    traffic.dataset.max = String(max);
    traffic.dataset.updates = String(updates);
  };
  const live = document.getElementById("live");
  const refresh = async () => {
    try {
      const r = await fetch("/status.json", { cache: "no-store" });
      if (!r.ok) throw new Error("HTTP " + r.status);
      show(await r.json());
      live.textContent = "Live: updated at " + new Date().toLocaleTimeString() + ".";
    } catch (e) {
      live.textContent = "Not updating: " + e.message + ".";
    }
  };
  refresh();
  setInterval(refresh, 2000);
})();
