//! Drawing a chart as SVG: the page, each panel's frame, its y-axis ticks,
//! the phase marks, its lines and legend. Written by hand: a few elements
//! do not justify a plotting library.

use std::fmt::Write as _;

use super::panel::{Mark, Panel, Series};

const WIDTH: f64 = 1000.0;
const PANEL_HEIGHT: f64 = 190.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 300.0;
const TOP: f64 = 40.0;
const GAP: f64 = 40.0;
const COLORS: &[&str] = &[
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

pub(super) fn chart(title: &str, panels: &[Panel], t_end: f64, marks: &[Mark]) -> String {
    let height = TOP + panels.len() as f64 * (PANEL_HEIGHT + GAP) + 20.0;
    let mut svg = String::new();
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="sans-serif" font-size="11">"#
    );
    let _ = write!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    text(&mut svg, LEFT, 20.0, title, "start", 14.0);
    for (i, panel) in panels.iter().enumerate() {
        let top = TOP + i as f64 * (PANEL_HEIGHT + GAP);
        draw_panel(&mut svg, panel, top, t_end, marks);
    }
    svg.push_str("</svg>\n");
    svg
}

/// A round tick step (1, 2 or 5 times a power of ten) near `raw`.
fn nice_step(raw: f64) -> f64 {
    if raw <= 0.0 || !raw.is_finite() {
        return 1.0;
    }
    let pow = 10f64.powf(raw.log10().floor());
    let f = raw / pow;
    let m = if f <= 1.0 {
        1.0
    } else if f <= 2.0 {
        2.0
    } else if f <= 5.0 {
        5.0
    } else {
        10.0
    };
    m * pow
}

/// Maps data to pixels inside one panel.
struct Frame {
    top: f64,
    t_end: f64,
    y_lo: f64,
    y_hi: f64,
    log: bool,
}

impl Frame {
    fn x(&self, t: f64) -> f64 {
        LEFT + (t / self.t_end).clamp(0.0, 1.0) * (WIDTH - LEFT - RIGHT)
    }

    fn y(&self, v: f64) -> f64 {
        let (lo, hi, v) = if self.log {
            (
                self.y_lo.log10(),
                self.y_hi.log10(),
                v.max(self.y_lo).log10(),
            )
        } else {
            (self.y_lo, self.y_hi, v)
        };
        let f = if hi > lo {
            ((v - lo) / (hi - lo)).clamp(0.0, 1.0)
        } else {
            0.0
        };
        self.top + PANEL_HEIGHT * (1.0 - f)
    }
}

fn y_range(panel: &Panel) -> (f64, f64) {
    let values = panel
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1));
    let hi = values.clone().fold(0.0f64, f64::max);
    if panel.log {
        let lo = values.filter(|v| *v > 0.0).fold(f64::MAX, f64::min);
        let lo = if lo == f64::MAX {
            0.1
        } else {
            10f64.powf(lo.log10().floor())
        };
        (lo, 10f64.powf(hi.max(lo * 10.0).log10().ceil()))
    } else if let Some(max) = panel.y_max {
        (0.0, max)
    } else {
        let step = nice_step(hi / 4.0);
        (0.0, ((hi * 1.05 / step).ceil() * step).max(step))
    }
}

fn draw_panel(svg: &mut String, panel: &Panel, top: f64, t_end: f64, marks: &[Mark]) {
    let (y_lo, y_hi) = y_range(panel);
    let frame = Frame {
        top,
        t_end,
        y_lo,
        y_hi,
        log: panel.log,
    };
    let plot_w = WIDTH - LEFT - RIGHT;
    let _ = write!(
        svg,
        r##"<rect x="{LEFT}" y="{top}" width="{plot_w}" height="{PANEL_HEIGHT}" fill="none" stroke="#888"/>"##
    );
    text(
        svg,
        LEFT,
        top - 6.0,
        &format!("{} [{}]", panel.title, panel.unit),
        "start",
        12.0,
    );
    draw_y_ticks(svg, &frame);
    draw_phases(svg, &frame, marks);
    for (i, s) in panel.series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        draw_series(svg, &frame, s, color);
        let ly = top + 12.0 + i as f64 * 15.0;
        let lx = WIDTH - RIGHT + 10.0;
        let dash = if s.dashed {
            r#" stroke-dasharray="4 3""#
        } else {
            ""
        };
        let _ = write!(
            svg,
            r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{color}" stroke-width="2"{dash}/>"#,
            lx + 18.0
        );
        text(svg, lx + 22.0, ly + 4.0, &s.name, "start", 10.0);
    }
    if panel.series.is_empty() {
        text(
            svg,
            LEFT + plot_w / 2.0,
            top + PANEL_HEIGHT / 2.0,
            "no data recorded",
            "middle",
            12.0,
        );
    }
}

fn draw_y_ticks(svg: &mut String, f: &Frame) {
    let ticks: Vec<f64> = if f.log {
        let (a, b) = (f.y_lo.log10().round() as i32, f.y_hi.log10().round() as i32);
        (a..=b).map(|e| 10f64.powi(e)).collect()
    } else {
        let step = nice_step((f.y_hi - f.y_lo) / 4.0);
        let n = ((f.y_hi - f.y_lo) / step).round() as i32;
        (0..=n).map(|i| f.y_lo + step * f64::from(i)).collect()
    };
    for v in ticks {
        let y = f.y(v);
        let _ = write!(
            svg,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#eee"/>"##,
            WIDTH - RIGHT
        );
        text(svg, LEFT - 5.0, y + 4.0, &short_number(v), "end", 10.0);
    }
}

fn draw_phases(svg: &mut String, f: &Frame, marks: &[Mark]) {
    for m in marks {
        let x = f.x(m.t);
        let bottom = f.top + PANEL_HEIGHT;
        let _ = write!(
            svg,
            r##"<line x1="{x:.1}" y1="{}" x2="{x:.1}" y2="{bottom}" stroke="#aaa" stroke-dasharray="2 3"/>"##,
            f.top
        );
        text(svg, x + 3.0, bottom - 4.0, &m.label, "start", 10.0);
    }
    let bottom = f.top + PANEL_HEIGHT;
    let step = nice_step(f.t_end / 10.0);
    let mut t = 0.0;
    while t <= f.t_end + 1e-9 {
        text(svg, f.x(t), bottom + 13.0, &format!("{t}s"), "middle", 9.0);
        t += step;
    }
}

fn draw_series(svg: &mut String, f: &Frame, s: &Series, color: &str) {
    if s.points.is_empty() {
        return;
    }
    let pts: Vec<String> = s
        .points
        .iter()
        .map(|(t, v)| format!("{:.1},{:.1}", f.x(*t), f.y(*v)))
        .collect();
    let dash = if s.dashed {
        r#" stroke-dasharray="4 3""#
    } else {
        ""
    };
    let _ = write!(
        svg,
        r#"<polyline fill="none" stroke="{color}" stroke-width="1.6"{dash} points="{}"/>"#,
        pts.join(" ")
    );
}

fn text(svg: &mut String, x: f64, y: f64, s: &str, anchor: &str, size: f64) {
    let escaped = s
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;");
    let _ = write!(
        svg,
        r#"<text x="{x:.1}" y="{y:.1}" text-anchor="{anchor}" font-size="{size}">{escaped}</text>"#
    );
}

pub(super) fn short_number(v: f64) -> String {
    match v.abs() {
        a if a >= 1e6 => format!("{:.1}M", v / 1e6),
        a if a >= 1e3 => format!("{:.1}k", v / 1e3),
        a if a >= 10.0 || a == 0.0 => format!("{v:.0}"),
        a if a >= 1.0 => format!("{v:.1}"),
        _ => format!("{v:.2}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_short() {
        assert_eq!(short_number(0.0), "0");
        assert_eq!(short_number(12_500.0), "12.5k");
        assert_eq!(short_number(2.5e6), "2.5M");
        assert_eq!(short_number(0.25), "0.25");
    }

    #[test]
    fn steps_are_round() {
        assert_eq!(nice_step(0.9), 1.0);
        assert_eq!(nice_step(1.2), 2.0);
        assert_eq!(nice_step(3.0), 5.0);
        assert_eq!(nice_step(700.0), 1000.0);
    }

    #[test]
    fn log_frame_maps_decades_evenly() {
        let f = Frame {
            top: 0.0,
            t_end: 10.0,
            y_lo: 1.0,
            y_hi: 100.0,
            log: true,
        };
        assert_eq!(f.y(1.0), PANEL_HEIGHT);
        assert_eq!(f.y(10.0), PANEL_HEIGHT / 2.0);
        assert_eq!(f.y(100.0), 0.0);
    }
}
