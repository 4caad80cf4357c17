//! Reading back the PNG files the tools write.

use std::path::Path;

/// The width and height of the PNG file at `path`, once every row of it has decoded.
pub fn png_size(path: &Path) -> (u32, u32) {
    let file = std::fs::File::open(path)
        .unwrap_or_else(|error| panic!("opening {}: {error}", path.display()));
    let mut reader = png::Decoder::new(std::io::BufReader::new(file))
        .read_info()
        .unwrap_or_else(|error| panic!("{} is not a PNG file: {error}", path.display()));
    let mut pixels = vec![0; reader.output_buffer_size()];
    let frame = reader
        .next_frame(&mut pixels)
        .unwrap_or_else(|error| panic!("decoding {}: {error}", path.display()));
    (frame.width, frame.height)
}
