//! Following one direction of a WebSocket connection frame by frame (RFC 6455, section 5.2)
//! without buffering it: the gate of a device server measures each message a client sends before
//! Burn's server buffers it, and knows where a frame ends so it can append a close frame there.

use std::fmt;

/// The longest HTTP request or response head the gate passes (the upgrade handshake).
pub(crate) const MAX_HTTP_HEAD_BYTES: usize = 16 * 1024;

/// The longest payload a control frame (close, ping, pong) may carry.
const MAX_CONTROL_PAYLOAD: u64 = 125;

/// Why a [`FrameMeter`] stopped a connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The HTTP head of the handshake is longer than [`MAX_HTTP_HEAD_BYTES`].
    HeadTooLong,
    /// A message (the sum of its frames so far) is larger than the limit.
    MessageTooLarge { bytes: u64, limit: u64 },
    /// A control frame is fragmented or longer than 125 bytes.
    BadControlFrame { opcode: u8, bytes: u64 },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::HeadTooLong => write!(
                f,
                "a handshake head longer than {MAX_HTTP_HEAD_BYTES} bytes"
            ),
            Refusal::MessageTooLarge { bytes, limit } => write!(
                f,
                "a message of {bytes} bytes, over this server's limit of {limit} bytes \
                 (--max-message-bytes)"
            ),
            Refusal::BadControlFrame { opcode, bytes } => write!(
                f,
                "a control frame (opcode {opcode}) of {bytes} bytes, or fragmented"
            ),
        }
    }
}

/// Where a [`FrameMeter`] is in the bytes of its direction.
#[derive(Clone, Copy, Debug)]
enum Position {
    /// In the HTTP head: `seen` bytes so far, the last `matched` of them a prefix of `\r\n\r\n`.
    HttpHead { seen: usize, matched: usize },
    /// In a frame's header: its first `have` bytes.
    FrameHeader { bytes: [u8; 14], have: usize },
    /// In a frame's payload, `left` bytes from its end.
    Payload { left: u64 },
}

/// Follows one direction of a WebSocket connection from its HTTP head on: where each frame
/// starts and ends, and how large the message being sent has grown.
#[derive(Clone, Debug)]
pub(crate) struct FrameMeter {
    position: Position,
    /// The bytes of the data message being sent, over its frames so far.
    message_bytes: u64,
    /// The largest message this direction may carry; `None`: any.
    max_message_bytes: Option<u64>,
}

impl FrameMeter {
    /// A meter of a direction that starts with its HTTP head, refusing messages larger than
    /// `max_message_bytes`.
    pub(crate) fn new(max_message_bytes: Option<u64>) -> Self {
        Self {
            position: Position::HttpHead {
                seen: 0,
                matched: 0,
            },
            message_bytes: 0,
            max_message_bytes,
        }
    }

    /// Whether the HTTP head has not ended yet.
    pub(crate) fn in_http_head(&self) -> bool {
        matches!(self.position, Position::HttpHead { .. })
    }

    /// Whether the bytes so far end exactly where a frame ends (or the head does).
    pub(crate) fn at_frame_boundary(&self) -> bool {
        matches!(self.position, Position::FrameHeader { have: 0, .. })
    }

    /// Follows `bytes`, the next of this direction, returning how many it took: all of them, or
    /// with `stop_at_boundary`, those up to the end of the current frame. Fails on the first
    /// frame header that breaks a limit, before the header's last byte is taken.
    pub(crate) fn consume(
        &mut self,
        bytes: &[u8],
        stop_at_boundary: bool,
    ) -> Result<usize, Refusal> {
        let mut used = 0;
        while used < bytes.len() {
            if stop_at_boundary && self.at_frame_boundary() {
                break;
            }
            match &mut self.position {
                Position::HttpHead { seen, matched } => {
                    let byte = bytes[used];
                    *seen += 1;
                    if *seen > MAX_HTTP_HEAD_BYTES {
                        return Err(Refusal::HeadTooLong);
                    }
                    *matched = match (byte, *matched) {
                        (b'\r', 2) => 3,
                        (b'\r', _) => 1,
                        (b'\n', 1 | 3) => *matched + 1,
                        _ => 0,
                    };
                    used += 1;
                    if *matched == 4 {
                        self.position = Self::next_header();
                    }
                }
                Position::FrameHeader {
                    bytes: header,
                    have,
                } => {
                    header[*have] = bytes[used];
                    *have += 1;
                    if *have >= 2 && *have == header_length(header) {
                        let header = *header;
                        self.begin_payload(&header)?;
                    }
                    used += 1;
                }
                Position::Payload { left } => {
                    let taken = (*left).min((bytes.len() - used) as u64);
                    *left -= taken;
                    used += taken as usize;
                    if *left == 0 {
                        self.position = Self::next_header();
                    }
                }
            }
        }
        Ok(used)
    }

    fn next_header() -> Position {
        Position::FrameHeader {
            bytes: [0; 14],
            have: 0,
        }
    }

    /// Checks the frame whose whole header is `header` and moves into its payload.
    fn begin_payload(&mut self, header: &[u8; 14]) -> Result<(), Refusal> {
        let final_fragment = header[0] & 0x80 != 0;
        let opcode = header[0] & 0x0f;
        let length = payload_length(header);
        if opcode >= 8 {
            if length > MAX_CONTROL_PAYLOAD || !final_fragment {
                return Err(Refusal::BadControlFrame {
                    opcode,
                    bytes: length,
                });
            }
        } else {
            // Opcode 0 continues a message; any other data opcode starts one.
            self.message_bytes = match opcode {
                0 => self.message_bytes.saturating_add(length),
                _ => length,
            };
            if let Some(limit) = self.max_message_bytes
                && self.message_bytes > limit
            {
                return Err(Refusal::MessageTooLarge {
                    bytes: self.message_bytes,
                    limit,
                });
            }
        }
        self.position = match length {
            0 => Self::next_header(),
            left => Position::Payload { left },
        };
        Ok(())
    }
}

/// The length of a frame header whose first two bytes are `header[..2]`: 2, the extended
/// length's 2 or 8 bytes, and the mask's 4.
fn header_length(header: &[u8; 14]) -> usize {
    let extended = match header[1] & 0x7f {
        126 => 2,
        127 => 8,
        _ => 0,
    };
    let mask = if header[1] & 0x80 != 0 { 4 } else { 0 };
    2 + extended + mask
}

/// The payload length a whole frame header declares.
fn payload_length(header: &[u8; 14]) -> u64 {
    match header[1] & 0x7f {
        126 => u64::from(u16::from_be_bytes([header[2], header[3]])),
        127 => u64::from_be_bytes(header[2..10].try_into().expect("8 bytes")),
        short => u64::from(short),
    }
}

/// A close frame from the server (unmasked) with `code` and as much of `reason` as fits a control
/// frame.
pub(crate) fn close_frame(code: u16, reason: &str) -> Vec<u8> {
    let mut end = reason.len().min(MAX_CONTROL_PAYLOAD as usize - 2);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    let mut frame = vec![0x88, (2 + end) as u8];
    frame.extend_from_slice(&code.to_be_bytes());
    frame.extend_from_slice(&reason.as_bytes()[..end]);
    frame
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEAD: &[u8] = b"GET /session HTTP/1.1\r\nHost: x\r\n\r\n";

    /// A client's frame (masked) with `opcode`, `fin` and `payload`, as RFC 6455 lays it out.
    fn frame(opcode: u8, fin: bool, payload: &[u8]) -> Vec<u8> {
        let mut bytes = vec![opcode | if fin { 0x80 } else { 0 }];
        match payload.len() {
            short @ 0..=125 => bytes.push(0x80 | short as u8),
            medium @ 126..=0xffff => {
                bytes.push(0x80 | 126);
                bytes.extend_from_slice(&(medium as u16).to_be_bytes());
            }
            long => {
                bytes.push(0x80 | 127);
                bytes.extend_from_slice(&(long as u64).to_be_bytes());
            }
        }
        let mask = [1u8, 2, 3, 4];
        bytes.extend_from_slice(&mask);
        bytes.extend(payload.iter().zip(mask.iter().cycle()).map(|(b, m)| b ^ m));
        bytes
    }

    /// Feeds `bytes` to `meter` `chunk` bytes at a time.
    fn feed(meter: &mut FrameMeter, bytes: &[u8], chunk: usize) -> Result<(), Refusal> {
        for piece in bytes.chunks(chunk) {
            assert_eq!(meter.consume(piece, false)?, piece.len());
        }
        Ok(())
    }

    #[test]
    fn messages_of_every_length_encoding_pass_under_the_limit_in_any_chunking() {
        let mut stream = HEAD.to_vec();
        for length in [0, 1, 125, 126, 65_535, 65_536, 70_000] {
            stream.extend(frame(2, true, &vec![7; length]));
        }
        stream.extend(frame(9, true, b"ping"));
        for chunk in [1, 3, 4096, stream.len()] {
            let mut meter = FrameMeter::new(Some(70_000));
            feed(&mut meter, &stream, chunk).unwrap();
            assert!(meter.at_frame_boundary() && !meter.in_http_head());
        }
    }

    #[test]
    fn a_message_is_refused_by_the_sum_of_its_fragments_before_the_last_header_is_passed() {
        let mut meter = FrameMeter::new(Some(100));
        let mut stream = HEAD.to_vec();
        stream.extend(frame(2, false, &[0; 60]));
        // A ping between fragments counts for nothing.
        stream.extend(frame(9, true, &[0; 10]));
        feed(&mut meter, &stream, 7).unwrap();
        let last = frame(0, true, &[0; 41]);
        let error = meter.consume(&last, false).unwrap_err();
        assert_eq!(
            error,
            Refusal::MessageTooLarge {
                bytes: 101,
                limit: 100
            }
        );
        assert!(error.to_string().contains("101 bytes") && error.to_string().contains("100"));

        // A new message starts counting again.
        let mut meter = FrameMeter::new(Some(100));
        let mut stream = HEAD.to_vec();
        stream.extend(frame(2, true, &[0; 100]));
        stream.extend(frame(1, true, &[0; 100]));
        feed(&mut meter, &stream, 64).unwrap();
    }

    #[test]
    fn a_declared_length_is_refused_without_its_payload() {
        let mut meter = FrameMeter::new(Some(1 << 20));
        feed(&mut meter, HEAD, 100).unwrap();
        // A header declaring 2^62 bytes, with no payload following.
        let mut header = vec![0x82, 0x80 | 127];
        header.extend_from_slice(&(1u64 << 62).to_be_bytes());
        header.extend_from_slice(&[0; 4]);
        assert_eq!(
            meter.consume(&header, false),
            Err(Refusal::MessageTooLarge {
                bytes: 1 << 62,
                limit: 1 << 20
            })
        );
    }

    #[test]
    fn bad_control_frames_and_endless_heads_are_refused() {
        let mut meter = FrameMeter::new(None);
        feed(&mut meter, HEAD, 9).unwrap();
        assert!(matches!(
            meter.consume(&frame(8, true, &[0; 126]), false),
            Err(Refusal::BadControlFrame { opcode: 8, .. })
        ));
        let mut meter = FrameMeter::new(None);
        feed(&mut meter, HEAD, 9).unwrap();
        assert!(matches!(
            meter.consume(&frame(9, false, b"x"), false),
            Err(Refusal::BadControlFrame { opcode: 9, .. })
        ));
        let mut meter = FrameMeter::new(None);
        let endless = vec![b'a'; MAX_HTTP_HEAD_BYTES + 1];
        assert_eq!(meter.consume(&endless, false), Err(Refusal::HeadTooLong));
        // `\r\n\r` then a byte is not the end of a head.
        let mut meter = FrameMeter::new(None);
        feed(&mut meter, b"GET / HTTP/1.1\r\n\rx\r\n", 1).unwrap();
        assert!(meter.in_http_head());
    }

    #[test]
    fn stopping_at_a_boundary_takes_exactly_the_rest_of_the_frame() {
        let mut meter = FrameMeter::new(None);
        let first = frame(2, true, &[1; 300]);
        let mut stream = HEAD.to_vec();
        stream.extend(&first);
        stream.extend(frame(2, true, &[2; 10]));
        let partway = HEAD.len() + 100;
        feed(&mut meter, &stream[..partway], 13).unwrap();
        assert!(!meter.at_frame_boundary());
        let taken = meter.consume(&stream[partway..], true).unwrap();
        assert_eq!(partway + taken, HEAD.len() + first.len());
        assert!(meter.at_frame_boundary());
        assert_eq!(meter.consume(&stream[partway + taken..], true), Ok(0));
    }

    #[test]
    fn a_close_frame_keeps_its_reason_within_a_control_frame() {
        let frame = close_frame(1009, &"é".repeat(100));
        assert_eq!(&frame[..4], &[0x88, frame.len() as u8 - 2, 0x03, 0xf1]);
        assert!(frame.len() - 2 <= 125);
        assert!(std::str::from_utf8(&frame[4..]).is_ok());
    }
}
