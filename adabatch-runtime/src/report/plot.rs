//! Pictures of runs: global batch size, coverage and epoch, loss and learning rate
//! against steps and against examples seen, several runs overlaid; with several
//! sources, the mixing weights too.
//!
//! Used by `adabatch plot RUN.jsonl ... -o OUT.svg|OUT.png` and by a run's own
//! `--plot PATH`. SVG needs no font (the viewer draws the text); PNG is drawn with
//! DejaVu Sans, embedded in the binary, so neither needs a system library.

use std::path::{Path, PathBuf};
use std::sync::Once;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::error::{Cause, Error, FileOp, Result};
use crate::report::record::StepLog;

/// One run to draw: its legend label and its logged steps, in order.
#[derive(Debug, Clone)]
pub struct RunLog {
    /// Legend label (by default the log file's name without `.jsonl`).
    pub label: String,
    /// The logged steps.
    pub steps: Vec<StepLog>,
    /// Evaluations: the step after which each ran, and its `eval_loss`.
    pub evals: Vec<(usize, f64)>,
}

impl RunLog {
    /// Reads a JSONL step log (`--log-jsonl`), labelled with the file's stem.
    pub fn read(path: &Path) -> Result<Self> {
        let label = path.file_stem().map_or_else(
            || path.display().to_string(),
            |s| s.to_string_lossy().into(),
        );
        let (steps, evals) = read_log(path)?;
        Ok(Self {
            label,
            steps,
            evals,
        })
    }

    /// x of each evaluation on `axis` (the x of the step it followed); evaluations
    /// after a step the log does not show are left out.
    fn eval_points(&self, xs: &[f64]) -> Vec<(f64, f64)> {
        self.evals
            .iter()
            .filter_map(|&(step, loss)| {
                let at = self.steps.iter().position(|s| s.step == step)?;
                loss.is_finite().then(|| (xs[at], loss))
            })
            .collect()
    }

    /// Examples seen after each logged step, and whether they are exact examples
    /// (`true`) or, when the log cannot tell the dataset's size, epochs (`false`).
    ///
    /// A log of every step sums the global batches; otherwise the dataset's size `N`
    /// is recovered from `epoch = seen / N` (the smallest `N` at least the largest
    /// global batch that makes every `epoch·N` and `train_coverage·N` whole).
    pub fn examples_seen(&self) -> (Vec<f64>, bool) {
        // The run's own count, when the log has it: exact at any interval.
        let counted: Option<Vec<f64>> = (self.steps.iter())
            .map(|s| s.examples_seen.map(|n| n as f64))
            .collect();
        if let Some(xs) = counted.filter(|xs| !xs.is_empty()) {
            return (xs, true);
        }
        let dense = self.steps.iter().enumerate().all(|(i, s)| s.step == i + 1);
        if dense {
            let mut seen = 0.0;
            let xs = self
                .steps
                .iter()
                .map(|s| {
                    seen += s.global_batch as f64;
                    seen
                })
                .collect();
            return (xs, true);
        }
        let whole = |x: f64| (x - x.round()).abs() < 1e-6 * x.abs().max(1.0);
        let smallest = self.steps.iter().map(|s| s.global_batch).max().unwrap_or(1);
        let found = (smallest.max(1)..=1_000_000).find(|&n| {
            self.steps
                .iter()
                .all(|s| whole(s.epoch * n as f64) && whole(s.train_coverage * n as f64))
        });
        match found {
            Some(n) => (
                self.steps
                    .iter()
                    .map(|s| (s.epoch * n as f64).round())
                    .collect(),
                true,
            ),
            None => (self.steps.iter().map(|s| s.epoch).collect(), false),
        }
    }
}

/// An evaluation in a log: the step after which it ran, and its loss.
type Evaluation = (usize, f64);

/// The steps and the evaluations (`"event": "eval"` lines) of a JSONL log. A line
/// that is not a record (a torn last line, a hand edit) is reported with its line
/// number and skipped: the rest is drawn.
fn read_log(path: &Path) -> Result<(Vec<StepLog>, Vec<Evaluation>)> {
    let text = std::fs::read_to_string(path).map_err(Error::io(FileOp::Read, path))?;
    let (mut steps, mut evals) = (Vec::new(), Vec::new());
    for (number, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let value: serde_json::Value = match serde_json::from_str(line) {
            Ok(value) => value,
            Err(e) => {
                super::messages::warning(&format!(
                    "{}:{}: skipped, not a JSON record: {e}",
                    path.display(),
                    number + 1
                ));
                continue;
            }
        };
        let event = value.get("event").and_then(|e| e.as_str());
        match (event, value.get("step").and_then(|s| s.as_u64())) {
            (Some("eval"), Some(step)) => {
                let loss = value
                    .get("eval_loss")
                    .and_then(|l| l.as_f64())
                    .unwrap_or(f64::NAN);
                evals.push((step as usize, loss));
            }
            (None, Some(_)) => match serde_json::from_value(value) {
                Ok(step) => steps.push(step),
                Err(e) => super::messages::warning(&format!(
                    "{}:{}: skipped, not a step record: {e}",
                    path.display(),
                    number + 1
                )),
            },
            _ => {}
        }
    }
    Ok((steps, evals))
}

/// Draws `runs` to `out`: SVG for `.svg`, PNG for `.png` (other extensions are an
/// error). The directory is created if needed.
pub fn plot_runs(runs: &[RunLog], out: &Path) -> Result<()> {
    let refuse = |detail: &str| Error::PlotRequest {
        path: out.to_path_buf(),
        detail: detail.into(),
    };
    if runs.is_empty() {
        return Err(refuse("no run to draw"));
    }
    if let Some(parent) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(Error::io(FileOp::CreateDir, parent))?;
    }
    register_font();
    let ext = out
        .extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase());
    // A row more for the mixing weights, and one per diagnostic of the mixer,
    // when some run mixed sources.
    let extra_rows = mixed_run(runs).map_or(0, |run| 1 + diagnostic_keys(&runs[run]).len());
    let size = (SIZE.0, SIZE.1 + SIZE.1 / 4 * extra_rows as u32);
    let drawn = match ext.as_deref() {
        Some("svg") => draw(SVGBackend::new(out, size).into_drawing_area(), runs),
        Some("png") => draw_png(out, size, runs),
        _ => return Err(refuse("the output must end in .svg or .png")),
    };
    drawn.map_err(|source| Error::Plot {
        path: out.to_path_buf(),
        source,
    })
}

/// Draws into an RGB buffer and writes it to `out` as a PNG.
fn draw_png(out: &Path, (width, height): (u32, u32), runs: &[RunLog]) -> Draw {
    let mut pixels = vec![0u8; width as usize * height as usize * 3];
    draw(
        BitMapBackend::with_buffer(&mut pixels, (width, height)).into_drawing_area(),
        runs,
    )?;
    let file = std::io::BufWriter::new(std::fs::File::create(out)?);
    let mut encoder = png::Encoder::new(file, width, height);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    let mut writer = encoder.write_header()?;
    writer.write_image_data(&pixels)?;
    writer.finish()?;
    Ok(())
}

/// A run's label from its log path, or `run` without one.
pub fn label_of(path: Option<&PathBuf>) -> String {
    path.and_then(|p| p.file_stem())
        .map_or_else(|| "run".into(), |s| s.to_string_lossy().into())
}

const SIZE: (u32, u32) = (1400, 1500);

fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // DejaVu Sans is a valid font: registration cannot fail.
        let _ = plotters::style::register_font(
            "sans-serif",
            FontStyle::Normal,
            dejavu::sans::regular(),
        );
    });
}

/// Colour-blind-safe palette (Okabe–Ito), one colour per run.
const PALETTE: [RGBColor; 7] = [
    RGBColor(0, 114, 178),
    RGBColor(230, 159, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(86, 180, 233),
    RGBColor(213, 94, 0),
    RGBColor(0, 0, 0),
];

fn colour(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

type Draw = std::result::Result<(), Cause>;

/// A run's points of one quantity against one axis, NaN values left out.
fn points(xs: &[f64], steps: &[StepLog], y: impl Fn(&StepLog) -> f64) -> Vec<(f64, f64)> {
    xs.iter()
        .zip(steps)
        .map(|(&x, s)| (x, y(s)))
        .filter(|(_, y)| y.is_finite())
        .collect()
}

/// The range of `values` with a little room, never empty.
fn range(values: impl Iterator<Item = f64>, from_zero: bool) -> std::ops::Range<f64> {
    let (mut lo, mut hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    if !lo.is_finite() || !hi.is_finite() {
        return 0.0..1.0;
    }
    if from_zero {
        lo = lo.min(0.0);
    }
    if hi - lo < 1e-12 {
        let pad = hi.abs().max(1e-12) * 0.1;
        lo -= pad;
        hi += pad;
        if from_zero {
            lo = lo.max(0.0).min(hi - pad);
        }
    }
    let pad = (hi - lo) * 0.05;
    (if from_zero && lo >= 0.0 { lo } else { lo - pad })..hi + pad
}

struct Axis {
    /// Per run: x of each logged step.
    xs: Vec<Vec<f64>>,
    label: &'static str,
}

fn draw<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, runs: &[RunLog]) -> Draw
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE)?;
    let (header, body) = root.split_vertically(86);
    let names: Vec<&str> = runs.iter().map(|r| r.label.as_str()).collect();
    let legend_row = header.titled(
        &format!("adabatch: {}", names.join(" vs ")),
        ("sans-serif", 26),
    )?;
    header_legend(&legend_row, runs)?;
    let seen: Vec<(Vec<f64>, bool)> = runs.iter().map(RunLog::examples_seen).collect();
    let exact = seen.iter().all(|(_, e)| *e);
    let by_step = Axis {
        xs: runs
            .iter()
            .map(|r| r.steps.iter().map(|s| s.step as f64).collect())
            .collect(),
        label: "optimisation step",
    };
    let by_examples = Axis {
        xs: seen.into_iter().map(|(xs, _)| xs).collect(),
        label: if exact {
            "examples seen"
        } else {
            "examples seen (in epochs: the log does not tell N)"
        },
    };
    let mixed = mixed_run(runs);
    let diagnostics = mixed.map_or_else(Vec::new, |run| diagnostic_keys(&runs[run]));
    let rows = 4 + mixed.map_or(0, |_| 1 + diagnostics.len());
    let panels = body.split_evenly((rows, 2));
    for (column, axis) in [by_step, by_examples].iter().enumerate() {
        let panel = |row: usize| &panels[row * 2 + column];
        let batch = ("Global batch size", "global batch (examples)");
        line_panel(
            panel(0),
            runs,
            axis,
            batch,
            |s| s.global_batch as f64,
            true,
            &[],
        )?;
        coverage_panel(panel(1), runs, axis)?;
        let evals: Vec<Vec<(f64, f64)>> = (runs.iter().zip(&axis.xs))
            .map(|(run, xs)| run.eval_points(xs))
            .collect();
        let has_evals = evals.iter().any(|e| !e.is_empty());
        let (caption, y_label) = if has_evals {
            ("Loss (line: training, triangles: eval)", "loss")
        } else {
            ("Training loss", "loss (mean since last log)")
        };
        line_panel(
            panel(2),
            runs,
            axis,
            (caption, y_label),
            |s| s.loss,
            false,
            &evals,
        )?;
        let lr = ("Learning rate", "learning rate");
        line_panel(panel(3), runs, axis, lr, |s| s.learning_rate, true, &[])?;
        if let Some(run) = mixed {
            let (run, xs) = (&runs[run], &axis.xs[run]);
            weights_panel(panel(4), run, xs, axis.label)?;
            let below = &panels[5 * 2..];
            mixer_panels(below, column, (run, xs, axis.label), &diagnostics)?;
        }
    }
    root.present()?;
    Ok(())
}

/// A row per mixer diagnostic under the weights, in `column` of `panels`.
fn mixer_panels<DB: DrawingBackend>(
    panels: &[DrawingArea<DB, Shift>],
    column: usize,
    (run, xs, x_label): (&RunLog, &[f64], &str),
    diagnostics: &[String],
) -> Draw
where
    DB::ErrorType: 'static,
{
    for (row, key) in diagnostics.iter().enumerate() {
        let caption = format!("Mixer: {key} ({})", run.label);
        let series = diagnostic_series(run, xs, key);
        let y = range(
            series.iter().flat_map(|(_, pts)| pts.iter().map(|p| p.1)),
            false,
        );
        let area = (
            &panels[row * 2 + column],
            range(xs.iter().copied(), true),
            y,
        );
        by_source_panel(area, (&caption, key, x_label), series)?;
    }
    Ok(())
}

/// The first run whose steps logged mixing weights.
fn mixed_run(runs: &[RunLog]) -> Option<usize> {
    runs.iter()
        .position(|r| r.steps.iter().any(|s| s.sources.mix_weights.is_some()))
}

/// Each source's mixing weight over the run (one colour per source).
fn weights_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    run: &RunLog,
    xs: &[f64],
    x_label: &str,
) -> Draw
where
    DB::ErrorType: 'static,
{
    let names: Vec<String> = (run.steps.iter())
        .find_map(|s| s.sources.mix_weights.as_ref())
        .map(|w| w.keys().cloned().collect())
        .unwrap_or_default();
    let series = (names.into_iter())
        .map(|name| {
            let pts = (xs.iter().zip(&run.steps))
                .filter_map(|(&x, s)| Some((x, *s.sources.mix_weights.as_ref()?.get(&name)?)))
                .collect();
            (name, pts)
        })
        .collect();
    let caption = format!("Mixing weights ({})", run.label);
    let area = (area, range(xs.iter().copied(), true), 0.0..1.0);
    by_source_panel(area, (&caption, "share", x_label), series)
}

/// The diagnostics of the mixer's record worth a panel of their own, in the
/// order they first appear: a number per source, or one number. A number per
/// pair of sources (a mixing law) is left to the log: a matrix over time does
/// not read as lines. At most three, so the picture stays readable.
fn diagnostic_keys(run: &RunLog) -> Vec<String> {
    const MOST: usize = 3;
    let mut keys: Vec<String> = Vec::new();
    for record in run
        .steps
        .iter()
        .filter_map(|s| s.sources.mixer.as_ref()?.as_object())
    {
        for (key, value) in record {
            let drawable = value.is_number()
                || value.as_object().is_some_and(|per_source| {
                    per_source.values().all(|v| v.is_number() || v.is_null())
                });
            if drawable && !keys.contains(key) && keys.len() < MOST {
                keys.push(key.clone());
            }
        }
    }
    keys
}

/// The lines of the mixer's diagnostic `key`: one per source, or one for a
/// single number (a `null`, NaN, is left out).
fn diagnostic_series(run: &RunLog, xs: &[f64], key: &str) -> Vec<(String, Vec<(f64, f64)>)> {
    let mut series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for (&x, step) in xs.iter().zip(&run.steps) {
        let Some(value) = step.sources.mixer.as_ref().and_then(|m| m.get(key)) else {
            continue;
        };
        let points: Vec<(String, Option<f64>)> = match value.as_object() {
            Some(per_source) => (per_source.iter())
                .map(|(source, v)| (source.clone(), v.as_f64()))
                .collect(),
            None => vec![(key.to_string(), value.as_f64())],
        };
        for (name, y) in points {
            let Some(y) = y.filter(|y| y.is_finite()) else {
                continue;
            };
            match series.iter_mut().find(|(n, _)| *n == name) {
                Some((_, pts)) => pts.push((x, y)),
                None => series.push((name, vec![(x, y)])),
            }
        }
    }
    series
}

/// Lines by source (one colour each, with a legend) over the run, on the run's
/// x range (so the panel lines up with those above it) and `y`.
fn by_source_panel<DB: DrawingBackend>(
    (area, x, y): (
        &DrawingArea<DB, Shift>,
        std::ops::Range<f64>,
        std::ops::Range<f64>,
    ),
    (caption, y_label, x_label): (&str, &str, &str),
    series: Vec<(String, Vec<(f64, f64)>)>,
) -> Draw
where
    DB::ErrorType: 'static,
{
    let mut chart = ChartBuilder::on(area)
        .margin(12)
        .caption(caption, ("sans-serif", 20))
        .x_label_area_size(42)
        .y_label_area_size(78)
        .build_cartesian_2d(x, y)?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc(y_label)
        .x_labels(8)
        .y_labels(6)
        .x_label_formatter(&|v| format_tick(*v))
        .y_label_formatter(&|v| format_tick(*v))
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 15))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()?;
    for (i, (name, pts)) in series.into_iter().enumerate() {
        let c = colour(i);
        chart
            .draw_series(LineSeries::new(pts, c.stroke_width(2)))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(3)));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(RGBColor(200, 200, 200))
        .label_font(("sans-serif", 14))
        .draw()?;
    Ok(())
}

fn x_range(axis: &Axis) -> std::ops::Range<f64> {
    range(axis.xs.iter().flatten().copied(), true)
}

fn line_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    runs: &[RunLog],
    axis: &Axis,
    (caption, y_label): (&str, &str),
    y: impl Fn(&StepLog) -> f64,
    from_zero: bool,
    marks: &[Vec<(f64, f64)>],
) -> Draw
where
    DB::ErrorType: 'static,
{
    let series: Vec<Vec<(f64, f64)>> = runs
        .iter()
        .zip(&axis.xs)
        .map(|(run, xs)| points(xs, &run.steps, &y))
        .collect();
    let values = series.iter().chain(marks).flatten().map(|p| p.1);
    let y_range = range(values, from_zero);
    let scientific = y_range.end.abs() < 1e-2 && y_range.end != 0.0;
    let mut chart = ChartBuilder::on(area)
        .margin(12)
        .caption(caption, ("sans-serif", 20))
        .x_label_area_size(42)
        .y_label_area_size(78)
        .build_cartesian_2d(x_range(axis), y_range)?;
    chart
        .configure_mesh()
        .x_desc(axis.label)
        .y_desc(y_label)
        .x_labels(8)
        .y_labels(6)
        .x_label_formatter(&|v| format_tick(*v))
        .y_label_formatter(&|v| {
            if scientific {
                format!("{v:.1e}")
            } else {
                format_tick(*v)
            }
        })
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 15))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()?;
    if series.iter().all(Vec::is_empty) {
        let (w, h) = area.dim_in_pixel();
        area.draw(&Text::new(
            "no values logged (a dry run has no loss)",
            (w as i32 / 2 - 150, h as i32 / 2),
            ("sans-serif", 16)
                .into_font()
                .color(&RGBColor(110, 110, 110)),
        ))?;
    }
    for (i, pts) in series.into_iter().enumerate() {
        let c = colour(i);
        let markers = pts.len() <= 60;
        chart.draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))?;
        if markers {
            chart.draw_series(pts.iter().map(|&p| Circle::new(p, 2, c.filled())))?;
        }
    }
    for (i, pts) in marks.iter().enumerate() {
        let c = colour(i);
        chart.draw_series(
            pts.iter()
                .map(|&p| TriangleMarker::new(p, 6, c.stroke_width(2))),
        )?;
    }
    Ok(())
}

/// One legend for all panels, under the title: each run's colour and label, and
/// what solid and dashed lines mean.
fn header_legend<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, runs: &[RunLog]) -> Draw
where
    DB::ErrorType: 'static,
{
    let font = ("sans-serif", 17).into_font().color(&BLACK);
    let (width, _) = area.dim_in_pixel();
    let mut entries: Vec<(String, ShapeStyle, bool)> = runs
        .iter()
        .enumerate()
        .map(|(i, r)| (r.label.clone(), colour(i).stroke_width(3), false))
        .collect();
    let grey = RGBColor(90, 90, 90);
    entries.push(("coverage".into(), grey.stroke_width(2), false));
    entries.push(("epoch".into(), grey.stroke_width(2), true));
    let widths: Vec<i32> = entries
        .iter()
        .map(|(label, _, _)| {
            area.estimate_text_size(label, &font)
                .map_or(8 * label.len() as i32, |(w, _)| w as i32)
                + 44
        })
        .collect();
    let total: i32 = widths.iter().sum::<i32>() + 30;
    let mut x = ((width as i32 - total) / 2).max(10);
    let y = 14;
    for (k, ((label, style, dashed), w)) in entries.iter().zip(&widths).enumerate() {
        if k == runs.len() {
            x += 30; // a gap between runs and line styles
        }
        if *dashed {
            for s in (0..30).step_by(10) {
                area.draw(&PathElement::new([(x + s, y), (x + s + 6, y)], *style))?;
            }
        } else {
            area.draw(&PathElement::new([(x, y), (x + 30, y)], *style))?;
        }
        area.draw(&Text::new(label.clone(), (x + 36, y - 9), font.clone()))?;
        x += w;
    }
    Ok(())
}

/// Coverage (solid, left axis) and epoch (dashed, right axis).
fn coverage_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    runs: &[RunLog],
    axis: &Axis,
) -> Draw
where
    DB::ErrorType: 'static,
{
    let epochs: Vec<Vec<(f64, f64)>> = runs
        .iter()
        .zip(&axis.xs)
        .map(|(run, xs)| points(xs, &run.steps, |s| s.epoch))
        .collect();
    let epoch_range = range(epochs.iter().flatten().map(|p| p.1), true);
    let mut chart = ChartBuilder::on(area)
        .margin(12)
        .caption(
            "Coverage (solid, left) and epoch (dashed, right)",
            ("sans-serif", 20),
        )
        .x_label_area_size(42)
        .y_label_area_size(78)
        .right_y_label_area_size(60)
        .build_cartesian_2d(x_range(axis), 0.0..1.05)?
        .set_secondary_coord(x_range(axis), epoch_range);
    chart
        .configure_mesh()
        .x_desc(axis.label)
        .y_desc("train coverage (fraction of N)")
        .x_labels(8)
        .y_labels(6)
        .x_label_formatter(&|v| format_tick(*v))
        .y_label_formatter(&|v| format!("{v:.1}"))
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 15))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()?;
    chart
        .configure_secondary_axes()
        .y_desc("epoch (passes over the data)")
        .y_labels(6)
        .y_label_formatter(&|v| format_tick(*v))
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 15))
        .draw()?;
    for (i, (run, xs)) in runs.iter().zip(&axis.xs).enumerate() {
        let c = colour(i);
        let coverage = points(xs, &run.steps, |s| s.train_coverage);
        chart.draw_series(LineSeries::new(coverage, c.stroke_width(2)))?;
        chart.draw_secondary_series(DashedLineSeries::new(
            epochs[i].clone(),
            6,
            4,
            c.stroke_width(2),
        ))?;
    }
    Ok(())
}

/// Tick labels without float noise: integers as integers, else up to 3 decimals.
fn format_tick(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 {
        format!("{}", v.round() as i64)
    } else if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_to_draw_and_an_unknown_format_are_typed_errors() {
        let out = std::env::temp_dir().join(format!("adabatch-plot-{}.svg", std::process::id()));
        let err = plot_runs(&[], &out).unwrap_err();
        assert!(
            matches!(&err, Error::PlotRequest { path, detail } if path == &out && detail == "no run to draw"),
            "{err}"
        );
        assert!(err.to_string().starts_with("plot "), "{err}");
    }

    fn entry(step: usize, global_batch: usize, epoch: f64, coverage: f64) -> StepLog {
        StepLog {
            step,
            examples_seen: None,
            epoch,
            train_coverage: coverage,
            local_batch_sizes: vec![global_batch],
            global_batch,
            indices: vec![],
            loss: 1.0,
            grad_norm: f64::NAN,
            learning_rate: 1e-3,
            examples_per_s: f64::NAN,
            micro_batches: 1,
            oom_events: 0,
            predicted_memory: None,
            measured_memory: None,
            gradient_noise_scale: None,
            noise_scale_interval: None,
            noise_scale_refused: 0,
            noise_scale_held: 0,
            noise_measurement: None,
            goodput: None,
            loss_scale: None,
            skipped_steps: 0,
            held_out: None,
            sources: Default::default(),
        }
    }

    #[test]
    fn examples_seen_of_dense_and_sparse_logs() {
        let dense = RunLog {
            label: "a".into(),
            steps: vec![entry(1, 4, 0.4, 0.4), entry(2, 4, 0.8, 0.8)],
            evals: Vec::new(),
        };
        assert_eq!(dense.examples_seen(), (vec![4.0, 8.0], true));
        // N = 10, logged every 2 steps: seen 7 then 13 (epoch 1.3, coverage 0.3).
        let sparse = RunLog {
            label: "b".into(),
            steps: vec![entry(2, 4, 0.7, 0.7), entry(4, 3, 1.3, 0.3)],
            evals: Vec::new(),
        };
        assert_eq!(sparse.examples_seen(), (vec![7.0, 13.0], true));
        // N = 7,328 logged every 10 steps of even batches: every count is even, so
        // a smaller N fits every epoch and the recovered counts are wrong; the run's
        // own count is exact.
        let mut even = vec![
            entry(10, 8, 80.0 / 7328.0, 80.0 / 7328.0),
            entry(20, 16, 200.0 / 7328.0, 200.0 / 7328.0),
        ];
        assert_ne!(
            RunLog {
                label: "c".into(),
                steps: even.clone(),
                evals: Vec::new()
            }
            .examples_seen()
            .0,
            vec![80.0, 200.0]
        );
        even[0].examples_seen = Some(80);
        even[1].examples_seen = Some(200);
        let counted = RunLog {
            label: "c".into(),
            steps: even,
            evals: vec![(20, 1.5), (30, 1.0)],
        };
        assert_eq!(counted.examples_seen(), (vec![80.0, 200.0], true));
        // The evaluation after step 20 sits at its x; one after an unlogged step is left out.
        assert_eq!(counted.eval_points(&[80.0, 200.0]), vec![(200.0, 1.5)]);
    }

    /// A mixed run's step with Aioli-like diagnostics: a mixture and probe losses
    /// per source, a law per pair (not drawn), a scalar.
    fn mixed_entry(step: usize, probe_loss: Option<f64>) -> StepLog {
        let mut entry = entry(step, 8, step as f64 / 100.0, step as f64 / 100.0);
        entry.sources.mix_weights = Some([("en".to_string(), 0.5), ("py".to_string(), 0.5)].into());
        entry.sources.mixer = Some(serde_json::json!({
            "mixture": {"en": 0.5, "py": 0.5},
            "law": {"en": {"en": 1.0, "py": 0.1}, "py": {"en": 0.2, "py": 1.0}},
            "probe_loss": {"en": probe_loss, "py": 4.0},
            "round": step,
        }));
        entry
    }

    #[test]
    fn a_mixers_diagnostics_are_drawn_per_source_and_its_law_is_left_to_the_log() {
        let run = RunLog {
            label: "aioli".into(),
            steps: vec![
                mixed_entry(1, Some(5.0)),
                mixed_entry(2, None),
                mixed_entry(3, Some(4.5)),
            ],
            evals: Vec::new(),
        };
        // serde_json's map is ordered by key.
        assert_eq!(diagnostic_keys(&run), ["mixture", "probe_loss", "round"]);
        let xs = [1.0, 2.0, 3.0];
        let probes = diagnostic_series(&run, &xs, "probe_loss");
        assert_eq!(
            probes,
            [
                ("en".to_string(), vec![(1.0, 5.0), (3.0, 4.5)]),
                ("py".to_string(), vec![(1.0, 4.0), (2.0, 4.0), (3.0, 4.0)])
            ],
            "a null (NaN) loss leaves a gap"
        );
        assert_eq!(
            diagnostic_series(&run, &xs, "round"),
            [(
                "round".to_string(),
                vec![(1.0, 1.0), (2.0, 2.0), (3.0, 3.0)]
            )]
        );
        let dir = std::env::temp_dir().join(format!("adabatch-plot-mixer-{}", std::process::id()));
        let (plain, mixed) = (dir.join("plain.png"), dir.join("mixed.png"));
        let mut unmixed = run.clone();
        unmixed
            .steps
            .iter_mut()
            .for_each(|s| s.sources = Default::default());
        plot_runs(&[unmixed], &plain).unwrap();
        plot_runs(&[run], &mixed).unwrap();
        let height = |path: &Path| {
            let decoder =
                png::Decoder::new(std::io::BufReader::new(std::fs::File::open(path).unwrap()));
            decoder.read_info().unwrap().info().height
        };
        // The weights' row and one per drawn diagnostic.
        assert_eq!(height(&mixed), height(&plain) + 4 * (SIZE.1 / 4));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn ticks() {
        assert_eq!(format_tick(3.0), "3");
        assert_eq!(format_tick(0.25), "0.25");
        assert_eq!(format_tick(1234.5), "1234");
    }
}
