//! A tiny dependency-free line-chart renderer that writes PNG files.
//!
//! Neither `plotters` nor any PNG crate is available offline on the build
//! machines, and font loading would need system font files, so the charts
//! of `neighbours` and `cores` are drawn here: an RGB canvas, Bresenham
//! lines, a built-in 5×7 bitmap font (upper-case letters, digits and a few
//! symbols; lower case is drawn as upper case), and a PNG encoder that uses
//! stored (uncompressed) deflate blocks, which every PNG reader accepts.
//! Charts are small (under 1 MB), so compression is not worth a dependency.

use crate::error::BenchError;
use std::path::Path;

/// An RGB colour.
pub type Rgb = [u8; 3];

/// Colours used for series, in order.
pub const PALETTE: [Rgb; 6] = [
    [214, 39, 40],
    [31, 119, 180],
    [44, 160, 44],
    [255, 127, 14],
    [148, 103, 189],
    [127, 127, 127],
];

const WHITE: Rgb = [255, 255, 255];
const BLACK: Rgb = [0, 0, 0];
const GRID: Rgb = [225, 225, 225];

/// An RGB image.
#[derive(Debug, Clone)]
pub struct Canvas {
    w: usize,
    h: usize,
    px: Vec<u8>,
}

impl Canvas {
    /// A white canvas of `w` × `h` pixels.
    pub fn new(w: usize, h: usize) -> Self {
        Canvas {
            w,
            h,
            px: vec![255; w * h * 3],
        }
    }

    /// Sets one pixel; points outside the canvas are ignored.
    pub fn set(&mut self, x: i64, y: i64, c: Rgb) {
        if x < 0 || y < 0 || x as usize >= self.w || y as usize >= self.h {
            return;
        }
        let i = (y as usize * self.w + x as usize) * 3;
        self.px[i..i + 3].copy_from_slice(&c);
    }

    /// The colour of one pixel (white outside the canvas).
    #[cfg(test)]
    pub fn get(&self, x: usize, y: usize) -> Rgb {
        if x >= self.w || y >= self.h {
            return WHITE;
        }
        let i = (y * self.w + x) * 3;
        [self.px[i], self.px[i + 1], self.px[i + 2]]
    }

    /// A straight line (Bresenham), `thick` pixels wide.
    pub fn line(&mut self, x0: i64, y0: i64, x1: i64, y1: i64, c: Rgb, thick: i64) {
        let (dx, dy) = ((x1 - x0).abs(), -(y1 - y0).abs());
        let (sx, sy) = (if x0 < x1 { 1 } else { -1 }, if y0 < y1 { 1 } else { -1 });
        let (mut x, mut y, mut err) = (x0, y0, dx + dy);
        let r = thick / 2;
        loop {
            for ox in -r..=r {
                for oy in -r..=r {
                    self.set(x + ox, y + oy, c);
                }
            }
            if x == x1 && y == y1 {
                break;
            }
            let e2 = 2 * err;
            if e2 >= dy {
                err += dy;
                x += sx;
            }
            if e2 <= dx {
                err += dx;
                y += sy;
            }
        }
    }

    /// A filled rectangle.
    pub fn fill(&mut self, x0: i64, y0: i64, x1: i64, y1: i64, c: Rgb) {
        for y in y0.min(y1)..=y0.max(y1) {
            for x in x0.min(x1)..=x0.max(x1) {
                self.set(x, y, c);
            }
        }
    }

    /// Text at (x, y) (top left), each font pixel drawn `scale` × `scale`.
    pub fn text(&mut self, x: i64, y: i64, s: &str, c: Rgb, scale: i64) {
        let mut cx = x;
        for ch in s.chars() {
            let g = glyph(ch);
            for (row, bits) in g.iter().enumerate() {
                for col in 0..5 {
                    if bits & (0x10 >> col) != 0 {
                        let px = cx + col * scale;
                        let py = y + row as i64 * scale;
                        self.fill(px, py, px + scale - 1, py + scale - 1, c);
                    }
                }
            }
            cx += 6 * scale;
        }
    }

    /// Text rotated by 90° counter-clockwise (reads bottom to top), its
    /// first character's bottom-left at (x, y).
    pub fn text_vertical(&mut self, x: i64, y: i64, s: &str, c: Rgb, scale: i64) {
        let mut cy = y;
        for ch in s.chars() {
            let g = glyph(ch);
            for (row, bits) in g.iter().enumerate() {
                for col in 0..5 {
                    if bits & (0x10 >> col) != 0 {
                        let px = x + row as i64 * scale;
                        let py = cy - col * scale;
                        self.fill(px, py, px + scale - 1, py - scale + 1, c);
                    }
                }
            }
            cy -= 6 * scale;
        }
    }

    /// Encodes the canvas as PNG (8-bit RGB, stored deflate blocks).
    pub fn to_png(&self) -> Vec<u8> {
        let mut raw = Vec::with_capacity(self.h * (self.w * 3 + 1));
        for y in 0..self.h {
            raw.push(0); // filter: none
            raw.extend_from_slice(&self.px[y * self.w * 3..(y + 1) * self.w * 3]);
        }
        let mut out = vec![0x89, b'P', b'N', b'G', 0x0d, 0x0a, 0x1a, 0x0a];
        let mut ihdr = Vec::with_capacity(13);
        ihdr.extend_from_slice(&(self.w as u32).to_be_bytes());
        ihdr.extend_from_slice(&(self.h as u32).to_be_bytes());
        ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
        chunk(&mut out, b"IHDR", &ihdr);
        chunk(&mut out, b"IDAT", &zlib_stored(&raw));
        chunk(&mut out, b"IEND", &[]);
        out
    }

    /// Writes the canvas as a PNG file.
    pub fn save(&self, path: &Path) -> Result<(), BenchError> {
        std::fs::write(path, self.to_png())
            .map_err(|e| BenchError::io(format!("writing {}", path.display()), e))
    }
}

fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    let start = out.len();
    out.extend_from_slice(kind);
    out.extend_from_slice(data);
    let crc = crc32(&out[start..]);
    out.extend_from_slice(&crc.to_be_bytes());
}

/// CRC-32 (IEEE, reflected), as PNG chunks use it.
pub fn crc32(data: &[u8]) -> u32 {
    let mut c = 0xffff_ffffu32;
    for &b in data {
        c ^= u32::from(b);
        for _ in 0..8 {
            c = if c & 1 != 0 {
                0xedb8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
        }
    }
    !c
}

/// Adler-32, the zlib stream checksum.
pub fn adler32(data: &[u8]) -> u32 {
    let (mut a, mut b) = (1u32, 0u32);
    for chunk in data.chunks(5552) {
        for &x in chunk {
            a += u32::from(x);
            b += a;
        }
        a %= 65521;
        b %= 65521;
    }
    (b << 16) | a
}

/// A zlib stream of stored (uncompressed) deflate blocks.
pub fn zlib_stored(data: &[u8]) -> Vec<u8> {
    let mut out = vec![0x78, 0x01];
    let mut blocks = data.chunks(65535).peekable();
    if blocks.peek().is_none() {
        out.extend_from_slice(&[1, 0, 0, 0xff, 0xff]);
    }
    while let Some(b) = blocks.next() {
        out.push(u8::from(blocks.peek().is_none()));
        let len = b.len() as u16;
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&(!len).to_le_bytes());
        out.extend_from_slice(b);
    }
    out.extend_from_slice(&adler32(data).to_be_bytes());
    out
}

/// The 5×7 glyph of `c`: seven rows, bit 4 is the leftmost column.
fn glyph(c: char) -> [u8; 7] {
    match c.to_ascii_uppercase() {
        '0' => [0x0e, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0e],
        '1' => [0x04, 0x0c, 0x04, 0x04, 0x04, 0x04, 0x0e],
        '2' => [0x0e, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1f],
        '3' => [0x1f, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0e],
        '4' => [0x02, 0x06, 0x0a, 0x12, 0x1f, 0x02, 0x02],
        '5' => [0x1f, 0x10, 0x1e, 0x01, 0x01, 0x11, 0x0e],
        '6' => [0x06, 0x08, 0x10, 0x1e, 0x11, 0x11, 0x0e],
        '7' => [0x1f, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08],
        '8' => [0x0e, 0x11, 0x11, 0x0e, 0x11, 0x11, 0x0e],
        '9' => [0x0e, 0x11, 0x11, 0x0f, 0x01, 0x02, 0x0c],
        'A' => [0x0e, 0x11, 0x11, 0x1f, 0x11, 0x11, 0x11],
        'B' => [0x1e, 0x11, 0x11, 0x1e, 0x11, 0x11, 0x1e],
        'C' => [0x0e, 0x11, 0x10, 0x10, 0x10, 0x11, 0x0e],
        'D' => [0x1c, 0x12, 0x11, 0x11, 0x11, 0x12, 0x1c],
        'E' => [0x1f, 0x10, 0x10, 0x1e, 0x10, 0x10, 0x1f],
        'F' => [0x1f, 0x10, 0x10, 0x1e, 0x10, 0x10, 0x10],
        'G' => [0x0e, 0x11, 0x10, 0x17, 0x11, 0x11, 0x0f],
        'H' => [0x11, 0x11, 0x11, 0x1f, 0x11, 0x11, 0x11],
        'I' => [0x0e, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0e],
        'J' => [0x07, 0x02, 0x02, 0x02, 0x02, 0x12, 0x0c],
        'K' => [0x11, 0x12, 0x14, 0x18, 0x14, 0x12, 0x11],
        'L' => [0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x1f],
        'M' => [0x11, 0x1b, 0x15, 0x15, 0x11, 0x11, 0x11],
        'N' => [0x11, 0x11, 0x19, 0x15, 0x13, 0x11, 0x11],
        'O' => [0x0e, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0e],
        'P' => [0x1e, 0x11, 0x11, 0x1e, 0x10, 0x10, 0x10],
        'Q' => [0x0e, 0x11, 0x11, 0x11, 0x15, 0x12, 0x0d],
        'R' => [0x1e, 0x11, 0x11, 0x1e, 0x14, 0x12, 0x11],
        'S' => [0x0f, 0x10, 0x10, 0x0e, 0x01, 0x01, 0x1e],
        'T' => [0x1f, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04],
        'U' => [0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0e],
        'V' => [0x11, 0x11, 0x11, 0x11, 0x11, 0x0a, 0x04],
        'W' => [0x11, 0x11, 0x11, 0x15, 0x15, 0x15, 0x0a],
        'X' => [0x11, 0x11, 0x0a, 0x04, 0x0a, 0x11, 0x11],
        'Y' => [0x11, 0x11, 0x11, 0x0a, 0x04, 0x04, 0x04],
        'Z' => [0x1f, 0x01, 0x02, 0x04, 0x08, 0x10, 0x1f],
        '.' => [0x00, 0x00, 0x00, 0x00, 0x00, 0x0c, 0x0c],
        ',' => [0x00, 0x00, 0x00, 0x00, 0x0c, 0x04, 0x08],
        ':' => [0x00, 0x0c, 0x0c, 0x00, 0x0c, 0x0c, 0x00],
        '-' => [0x00, 0x00, 0x00, 0x1f, 0x00, 0x00, 0x00],
        '+' => [0x00, 0x04, 0x04, 0x1f, 0x04, 0x04, 0x00],
        '=' => [0x00, 0x00, 0x1f, 0x00, 0x1f, 0x00, 0x00],
        '_' => [0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x1f],
        '/' => [0x00, 0x01, 0x02, 0x04, 0x08, 0x10, 0x00],
        '%' => [0x18, 0x19, 0x02, 0x04, 0x08, 0x13, 0x03],
        '(' => [0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02],
        ')' => [0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08],
        '[' => [0x0e, 0x08, 0x08, 0x08, 0x08, 0x08, 0x0e],
        ']' => [0x0e, 0x02, 0x02, 0x02, 0x02, 0x02, 0x0e],
        '<' => [0x02, 0x04, 0x08, 0x10, 0x08, 0x04, 0x02],
        '>' => [0x08, 0x04, 0x02, 0x01, 0x02, 0x04, 0x08],
        'µ' => [0x00, 0x11, 0x11, 0x11, 0x13, 0x1d, 0x10],
        ' ' => [0; 7],
        _ => [0x1f, 0x11, 0x11, 0x11, 0x11, 0x11, 0x1f],
    }
}

/// One line of a chart.
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend text.
    pub name: String,
    /// Colour.
    pub color: Rgb,
    /// Points (x, y); non-finite points (and, on a log axis, y ≤ 0) are
    /// skipped and break the line.
    pub points: Vec<(f64, f64)>,
    /// Draw a marker at each point.
    pub markers: bool,
}

/// A line chart drawn into one rectangle of a canvas.
#[derive(Debug, Clone)]
pub struct Chart {
    /// Title above the plot area.
    pub title: String,
    /// Label of the x axis.
    pub x_label: String,
    /// Label of the y axis.
    pub y_label: String,
    /// Logarithmic y axis.
    pub log_y: bool,
    /// Fixed y range; `None` fits the data.
    pub y_range: Option<(f64, f64)>,
    /// The lines.
    pub series: Vec<Series>,
}

/// Ticks for a linear axis over [lo, hi]: about `n` round values.
pub fn linear_ticks(lo: f64, hi: f64, n: usize) -> Vec<f64> {
    if !(lo.is_finite() && hi.is_finite()) || hi <= lo || n == 0 {
        return vec![lo];
    }
    let raw = (hi - lo) / n as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    let mut t = (lo / step).ceil() * step;
    let mut out = Vec::new();
    while t <= hi + step * 1e-9 && out.len() < 50 {
        out.push(if t.abs() < step * 1e-9 { 0.0 } else { t });
        t += step;
    }
    out
}

/// Short text for a tick value.
pub fn tick_label(v: f64) -> String {
    let a = v.abs();
    if a >= 1e6 {
        format!("{:.0}M", v / 1e6)
    } else if a >= 1e4 {
        format!("{:.0}K", v / 1e3)
    } else if a >= 10.0 || v == v.round() {
        format!("{v:.0}")
    } else if a >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

impl Chart {
    /// Draws the chart into the rectangle (x, y, w, h) of `cv`.
    pub fn draw(&self, cv: &mut Canvas, x: i64, y: i64, w: i64, h: i64) {
        let (left, right, top, bottom) = (x + 70, x + w - 20, y + 30, y + h - 45);
        if right <= left || bottom <= top {
            return;
        }
        let tx = |v: f64| if self.log_y { v.log10() } else { v };
        let ok = |p: &(f64, f64)| p.0.is_finite() && p.1.is_finite() && (!self.log_y || p.1 > 0.0);
        let pts = || {
            self.series
                .iter()
                .flat_map(|s| s.points.iter())
                .filter(|p| ok(p))
        };
        let (mut x0, mut x1) = (f64::INFINITY, f64::NEG_INFINITY);
        let (mut y0, mut y1) = (f64::INFINITY, f64::NEG_INFINITY);
        for p in pts() {
            x0 = x0.min(p.0);
            x1 = x1.max(p.0);
            y0 = y0.min(tx(p.1));
            y1 = y1.max(tx(p.1));
        }
        if let Some((a, b)) = self.y_range {
            y0 = tx(a);
            y1 = tx(b);
        }
        if !x0.is_finite() {
            (x0, x1, y0, y1) = (0.0, 1.0, 0.0, 1.0);
        }
        if x1 <= x0 {
            x1 = x0 + 1.0;
        }
        if self.log_y {
            y0 = y0.floor();
            y1 = y1.ceil().max(y0 + 1.0);
        } else {
            if self.y_range.is_none() {
                y0 = y0.min(0.0);
                y1 += (y1 - y0) * 0.08;
            }
            if y1 <= y0 {
                y1 = y0 + 1.0;
            }
        }
        let px = |v: f64| left + ((v - x0) / (x1 - x0) * (right - left) as f64).round() as i64;
        let py = |v: f64| bottom - ((v - y0) / (y1 - y0) * (bottom - top) as f64).round() as i64;
        // Grid and tick labels.
        let yt: Vec<f64> = if self.log_y {
            (y0 as i64..=y1 as i64).map(|e| e as f64).collect()
        } else {
            linear_ticks(y0, y1, 5)
        };
        for t in yt {
            let yy = py(t);
            cv.line(left, yy, right, yy, GRID, 1);
            let v = if self.log_y { 10f64.powf(t) } else { t };
            let s = tick_label(v);
            cv.text(left - 8 - 6 * s.len() as i64, yy - 3, &s, BLACK, 1);
        }
        for t in linear_ticks(x0, x1, 6) {
            let xx = px(t);
            cv.line(xx, top, xx, bottom, GRID, 1);
            let s = tick_label(t);
            cv.text(xx - 3 * s.len() as i64, bottom + 6, &s, BLACK, 1);
        }
        cv.line(left, bottom, right, bottom, BLACK, 1);
        cv.line(left, top, left, bottom, BLACK, 1);
        cv.text(left, y + 8, &self.title, BLACK, 2);
        let xl = self.x_label.len() as i64 * 6;
        cv.text(
            (left + right) / 2 - xl / 2,
            bottom + 22,
            &self.x_label,
            BLACK,
            1,
        );
        let yl = self.y_label.len() as i64 * 6;
        cv.text_vertical(x + 6, (top + bottom) / 2 + yl / 2, &self.y_label, BLACK, 1);
        // Lines.
        for s in &self.series {
            let mut prev: Option<(i64, i64)> = None;
            for p in &s.points {
                if !ok(p) {
                    prev = None;
                    continue;
                }
                let q = (px(p.0), py(tx(p.1)).clamp(top, bottom));
                if let Some(a) = prev {
                    cv.line(a.0, a.1, q.0, q.1, s.color, 2);
                }
                if s.markers {
                    cv.fill(q.0 - 3, q.1 - 3, q.0 + 3, q.1 + 3, s.color);
                }
                prev = Some(q);
            }
        }
        // Legend, top right inside the plot.
        let longest = self.series.iter().map(|s| s.name.len()).max().unwrap_or(0) as i64;
        let lx = right - 30 - longest * 6;
        for (i, s) in self.series.iter().enumerate() {
            let ly = top + 6 + 12 * i as i64;
            cv.fill(lx - 1, ly - 2, right - 2, ly + 9, WHITE);
            cv.line(lx, ly + 3, lx + 16, ly + 3, s.color, 2);
            cv.text(lx + 22, ly, &s.name, BLACK, 1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc_and_adler_match_known_values() {
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
        assert_eq!(crc32(b"IEND"), 0xae42_6082);
        assert_eq!(adler32(b"Wikipedia"), 0x11e6_0398);
    }

    #[test]
    fn stored_zlib_frames_blocks() {
        let z = zlib_stored(&[7u8; 70000]);
        // header, two block headers (5 bytes each), data, adler.
        assert_eq!(z.len(), 2 + 5 + 65535 + 5 + (70000 - 65535) + 4);
        assert_eq!(z[2], 0); // first block is not final
        assert_eq!(z[2 + 5 + 65535], 1); // second is
        assert_eq!(zlib_stored(&[]).len(), 2 + 5 + 4);
    }

    #[test]
    fn png_has_signature_and_chunks() {
        let mut c = Canvas::new(4, 3);
        c.line(0, 0, 3, 2, [1, 2, 3], 1);
        assert_eq!(c.get(0, 0), [1, 2, 3]);
        assert_eq!(c.get(3, 2), [1, 2, 3]);
        let png = c.to_png();
        assert_eq!(&png[..8], &[0x89, b'P', b'N', b'G', 0x0d, 0x0a, 0x1a, 0x0a]);
        assert_eq!(&png[12..16], b"IHDR");
        assert_eq!(&png[png.len() - 8..png.len() - 4], b"IEND");
    }

    #[test]
    fn ticks_are_round() {
        assert_eq!(
            linear_ticks(0.0, 10.0, 5),
            vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
        );
        assert_eq!(linear_ticks(0.0, 1.0, 4), vec![0.0, 0.25, 0.5, 0.75, 1.0]);
        assert_eq!(tick_label(25000.0), "25K");
        assert_eq!(tick_label(0.5), "0.50");
    }
}
