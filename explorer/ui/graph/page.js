(function () {
  const FE = window.FE;
  const net = network;
  function shapeBand(ctx, band, grow) {
    const pad = FE.bandPad + grow;
    for (const id of band.nodes) {
      const b = net.getBoundingBox(id);
      if (!b) continue;
      const x = b.left - pad, y = b.top - pad, w = b.right - b.left + 2 * pad, h = b.bottom - b.top + 2 * pad;
      const r = Math.min(10, h / 3);
      ctx.beginPath();
      ctx.moveTo(x + r, y); ctx.arcTo(x + w, y, x + w, y + h, r); ctx.arcTo(x + w, y + h, x, y + h, r);
      ctx.arcTo(x, y + h, x, y, r); ctx.arcTo(x, y, x + w, y, r); ctx.closePath(); ctx.fill();
    }
    ctx.lineCap = "butt"; ctx.lineJoin = "round";
    for (const path of band.paths) {
      for (let i = 1; i < path.length; i++) {   // full width where aligned, a narrow neck where not
        const p = path[i - 1], q = path[i];
        const w = Math.abs(p[0] - q[0]) < 1 ? band.neckX : Math.abs(p[1] - q[1]) < 1 ? band.neckY : FE.neck;
        ctx.lineWidth = w + 2 * grow;
        ctx.beginPath(); ctx.moveTo(p[0], p[1]); ctx.lineTo(q[0], q[1]); ctx.stroke();
      }
    }
  }
  net.on("beforeDrawing", function (ctx) {
    for (const band of FE.bands) {            // outline first, then the fill over it: one outline per band
      ctx.fillStyle = band.border; ctx.strokeStyle = band.border; shapeBand(ctx, band, 2);
    }
    for (const band of FE.bands) { ctx.fillStyle = band.fill; ctx.strokeStyle = band.fill; shapeBand(ctx, band, 0); }
  });
  function startView() {
    const ids = FE.real;
    if (!ids.length) return;
    net.fit({nodes: ids, animation: false});
    const fitScale = net.getScale();
    if (fitScale * FE.fontPx >= FE.minFontPx && !FE.centerOn) return;
    const scale = Math.max(fitScale, FE.minFontPx / FE.fontPx);
    const el = document.getElementById("mynetwork");
    const w = el.clientWidth, h = el.clientHeight;
    let pos;
    if (FE.centerOn && net.body.nodes[FE.centerOn]) {
      pos = net.getPositions([FE.centerOn])[FE.centerOn];
    } else {
      const b = FE.bounds, start = FE.start;
      if (FE.direction === "TB") pos = {x: start, y: b.top + (h / 2 - 24) / scale};
      else pos = {x: b.left + (w / 2 - 24) / scale, y: start};
    }
    net.moveTo({position: pos, scale: scale, animation: false});
  }
  startView();
  window.FE.ready = true;
  const el = document.getElementById("mynetwork");
  el.addEventListener("wheel", function (ev) {
    if (ev.ctrlKey || ev.metaKey) return;         // vis-network zooms
    ev.preventDefault(); ev.stopPropagation();
    const s = net.getScale(), p = net.getViewPosition();
    const dx = ev.shiftKey ? ev.deltaY : ev.deltaX, dy = ev.shiftKey ? 0 : ev.deltaY;
    net.moveTo({position: {x: p.x + dx / s, y: p.y + dy / s}, scale: s, animation: false});
  }, {capture: true, passive: false});
  if (!FE.overview) return;
  const map = document.createElement("canvas");
  const b = FE.bounds, bw = Math.max(b.right - b.left, 1), bh = Math.max(b.bottom - b.top, 1);
  const maxW = 110, maxH = Math.min(170, el.clientHeight - 80);
  const k = Math.min(maxW / bw, maxH / bh);
  map.width = Math.max(40, Math.ceil(bw * k) + 8); map.height = Math.max(40, Math.ceil(bh * k) + 8);
  map.title = FE.mapTitle;
  map.style.cssText = "position:absolute;right:8px;top:8px;background:rgba(255,255,255,0.8);" +
    "border:1px solid #9e9e9e;border-radius:4px;cursor:pointer;z-index:5";
  map.id = "fe-overview";
  el.appendChild(map);
  const mctx = map.getContext("2d");
  const toMap = (x, y) => [4 + (x - b.left) * k, 4 + (y - b.top) * k];
  function drawMap() {
    mctx.clearRect(0, 0, map.width, map.height);
    for (const n of FE.mapNodes) {
      const [x, y] = toMap(n[0] - n[2] / 2, n[1] - n[3] / 2);
      mctx.fillStyle = n[4];
      mctx.fillRect(x, y, Math.max(1.5, n[2] * k), Math.max(1.5, n[3] * k));
    }
    const s = net.getScale(), p = net.getViewPosition();
    const [vx, vy] = toMap(p.x - el.clientWidth / 2 / s, p.y - el.clientHeight / 2 / s);
    mctx.strokeStyle = "#d81b60"; mctx.lineWidth = 2;
    mctx.strokeRect(vx, vy, el.clientWidth / s * k, el.clientHeight / s * k);
  }
  let dragging = false;
  function jump(ev) {
    const r = map.getBoundingClientRect();
    const x = b.left + (ev.clientX - r.left - 4) / k, y = b.top + (ev.clientY - r.top - 4) / k;
    net.moveTo({position: {x: x, y: y}, scale: net.getScale(), animation: false});
  }
  map.addEventListener("mousedown", function (ev) { dragging = true; jump(ev); ev.stopPropagation(); });
  window.addEventListener("mousemove", function (ev) { if (dragging) jump(ev); });
  window.addEventListener("mouseup", function () { dragging = false; });
  map.addEventListener("wheel", function (ev) { ev.stopPropagation(); }, {passive: true});
  net.on("afterDrawing", drawMap);
  drawMap();
})();
