//! What a chart is made of: panels of named lines sharing the time axis,
//! and the marks drawn across them (phase boundaries).

/// A named line of (t seconds, value) points.
pub(super) struct Series {
    pub(super) name: String,
    pub(super) points: Vec<(f64, f64)>,
    pub(super) dashed: bool,
}

/// One panel: a title, a y-axis and its lines.
pub(super) struct Panel {
    pub(super) title: String,
    pub(super) unit: String,
    pub(super) log: bool,
    /// A fixed top of the y-axis (for percentages); otherwise from the data.
    pub(super) y_max: Option<f64>,
    pub(super) series: Vec<Series>,
}

/// A phase boundary: where it starts and its label.
pub(super) struct Mark {
    pub(super) t: f64,
    pub(super) label: String,
}

/// One point per second of a timeline, at the middle of its second.
pub(super) fn per_second<T>(points: &[T], f: impl Fn(&T) -> Option<f64>) -> Vec<(f64, f64)> {
    points
        .iter()
        .enumerate()
        .filter_map(|(i, p)| f(p).map(|v| (i as f64 + 0.5, v)))
        .collect()
}

pub(super) fn line(name: &str, points: Vec<(f64, f64)>, dashed: bool) -> Series {
    Series {
        name: name.to_owned(),
        points,
        dashed,
    }
}
