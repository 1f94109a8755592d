package harness

import (
	"fmt"
	"html"
	"math"
	"strings"
)

// bar is one bar of a panel: the median, with a whisker from lo to hi.
type bar struct {
	label, sub  string
	med, lo, hi float64
	color       string
	light       bool
}

type panel struct {
	title, sub, unit string
	bars             []bar
}

var clientColor = map[Client]string{Extworker: "#00758f", Java: "#e76f00", JS: "#b59a00", Raw: "#666666"}

// Chart renders scenarios 1 to 3 as one SVG: throughput, I/O-bound wall time and
// pickup latency, each bar a median with its min–max whisker.
func Chart(r *Results) string {
	var panels []panel
	if ss := r.scenario(1); len(ss) > 0 {
		p := panel{title: fmt.Sprintf("1 · no-op handler, %d instances", r.Opts.N1), sub: "tasks per second, higher is better", unit: "tasks/s"}
		for _, s := range ss {
			m := s.of(tps)
			p.bars = append(p.bars, bar{label: s.Variant.Short, med: m.med, lo: m.lo, hi: m.hi, color: clientColor[s.Variant.Client]})
		}
		panels = append(panels, p)
	}
	if ss := r.scenario(2); len(ss) > 0 {
		p := panel{title: fmt.Sprintf("2 · %v of I/O per task, %d instances", r.Opts.IOWait, r.Opts.N2), sub: "wall time in seconds, lower is better", unit: "s"}
		for _, s := range ss {
			m := s.of(wallS)
			p.bars = append(p.bars, bar{label: s.Variant.Short, med: m.med, lo: m.lo, hi: m.hi, color: clientColor[s.Variant.Client], light: s.Variant.ID != "extworker" && strings.HasSuffix(s.Variant.ID, "default")})
		}
		panels = append(panels, p)
	}
	if ss := r.scenario(3); len(ss) > 0 {
		p := panel{title: "3 · pickup latency, long polling on", sub: "start call returned → handler started, ms, lower is better", unit: "ms"}
		for _, s := range ss {
			a, b := s.of(p50ms), s.of(p99ms)
			p.bars = append(p.bars,
				bar{label: s.Variant.Short, sub: "p50", med: a.med, lo: a.lo, hi: a.hi, color: clientColor[s.Variant.Client]},
				bar{label: s.Variant.Short, sub: "p99", med: b.med, lo: b.lo, hi: b.hi, color: clientColor[s.Variant.Client], light: true})
		}
		panels = append(panels, p)
	}

	const pw, ph, top = 430, 380, 56
	width := max(1, len(panels)) * pw
	height := ph + top + 30
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="Helvetica, Arial, sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="#ffffff"/>`+"\n")
	fmt.Fprintf(&b, `<text x="12" y="22" font-size="16" font-weight="bold">extworker vs the official Camunda 7 clients</text>`+"\n")
	runs := fmt.Sprintf("median of %d runs, whiskers min–max", r.Opts.Runs)
	if r.Opts.Runs == 1 {
		runs = "one run"
	}
	fmt.Fprintf(&b, `<text x="12" y="40" fill="#555">%s; same engine (%s), same machine, workers taking turns; pale bars: client defaults, p99</text>`+"\n",
		runs, html.EscapeString(engineVersion(r)))
	if len(panels) == 0 {
		fmt.Fprintf(&b, `<text x="12" y="80">no data</text>`+"\n")
	}
	for i, p := range panels {
		drawPanel(&b, p, float64(i*pw), top, pw, ph)
	}
	b.WriteString("</svg>\n")
	return b.String()
}

func engineVersion(r *Results) string {
	for _, v := range r.Versions {
		if v[0] == "Camunda 7 engine" {
			s, _, _ := strings.Cut(v[1], " (")
			return "Camunda " + s
		}
	}
	return "Camunda 7"
}

func drawPanel(b *strings.Builder, p panel, x0, y0 float64, w, h int) {
	const left, right, bottom, titleH = 56.0, 14.0, 58.0, 40.0
	plotX, plotY := x0+left, y0+titleH
	plotW, plotH := float64(w)-left-right, float64(h)-titleH-bottom
	fmt.Fprintf(b, `<text x="%.1f" y="%.1f" font-size="13" font-weight="bold">%s</text>`+"\n", x0+10, y0+14, html.EscapeString(p.title))
	fmt.Fprintf(b, `<text x="%.1f" y="%.1f" fill="#555">%s</text>`+"\n", x0+10, y0+30, html.EscapeString(p.sub))

	top := 0.0
	for _, br := range p.bars {
		top = max(top, br.hi, br.med)
	}
	step, ymax := niceScale(top)
	y := func(v float64) float64 { return plotY + plotH - v/ymax*plotH }
	for v := 0.0; v <= ymax+step/2; v += step {
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#e4e4e4"/>`+"\n", plotX, y(v), plotX+plotW, y(v))
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="end" fill="#555">%s</text>`+"\n", plotX-6, y(v)+4, tick(v))
	}
	fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#333"/>`+"\n", plotX, plotY+plotH, plotX+plotW, plotY+plotH)
	fmt.Fprintf(b, `<text transform="translate(%.1f,%.1f) rotate(-90)" text-anchor="middle" fill="#555">%s</text>`+"\n", x0+14, plotY+plotH/2, html.EscapeString(p.unit))

	n := len(p.bars)
	if n == 0 {
		return
	}
	slot := plotW / float64(n)
	bw := math.Min(slot*0.7, 56)
	for i, br := range p.bars {
		cx := plotX + slot*(float64(i)+0.5)
		opacity := 1.0
		if br.light {
			opacity = 0.45
		}
		fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s" fill-opacity="%.2f"/>`+"\n",
			cx-bw/2, y(br.med), bw, plotY+plotH-y(br.med), br.color, opacity)
		if br.hi > br.lo {
			fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#222"/>`+"\n", cx, y(br.lo), cx, y(br.hi))
			for _, v := range []float64{br.lo, br.hi} {
				fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#222"/>`+"\n", cx-bw/5, y(v), cx+bw/5, y(v))
			}
		}
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="middle" font-weight="bold">%s</text>`+"\n", cx, math.Min(y(br.hi), y(br.med))-5, num(br.med))
		label := br.label
		if br.sub != "" {
			fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="middle" fill="#555">%s</text>`+"\n", cx, plotY+plotH+14, br.sub)
			if i%2 == 1 {
				continue // one client label under each p50/p99 pair
			}
			cx += slot / 2
		}
		words := strings.SplitN(label, " ", 2)
		for j, wd := range words {
			fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", cx, plotY+plotH+float64(28+14*j), html.EscapeString(wd))
		}
	}
}

// niceScale returns a tick step of 1, 2 or 5 times a power of ten and the axis maximum,
// with about five ticks and room above the highest value.
func niceScale(top float64) (step, ymax float64) {
	if top <= 0 {
		return 1, 5
	}
	raw := top * 1.12 / 5
	pow := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*pow >= raw {
			step = m * pow
			break
		}
	}
	return step, math.Ceil(top*1.12/step) * step
}

func tick(v float64) string {
	if v == math.Trunc(v) {
		return fmt.Sprintf("%.0f", v)
	}
	return strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.2f", v), "0"), ".")
}
