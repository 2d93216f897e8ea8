//! The frame scrubber against a decoder of what the agent receives: messages whole and as
//! scrubbing them whole gives, however the upstream's bytes are cut.

use super::*;

const SECRET: &str = "sk_live_4eC39HqLyjWDarjtT1zdp7dc";

fn frame(fin: bool, opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    write_head(&mut out, fin, opcode, payload.len() as u64);
    out.extend_from_slice(payload);
    out
}

fn knowing(secrets: &'static [&'static str]) -> FrameScrubber {
    FrameScrubber::new(Box::new(move || {
        (!secrets.is_empty()).then(|| Scrubber::new(secrets.iter().copied()))
    }))
}

/// Frames as the agent's client reads them: (opcode, fin, payload).
fn frames(mut bytes: &[u8]) -> Vec<(u8, bool, Vec<u8>)> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let (fin, opcode) = (bytes[0] & 0x80 != 0, bytes[0] & 0x0f);
        assert_eq!(bytes[1] & 0x80, 0, "frames to the agent are unmasked");
        let (len, at) = match bytes[1] & 0x7f {
            126 => (u16::from_be_bytes([bytes[2], bytes[3]]) as usize, 4),
            127 => (
                u64::from_be_bytes(bytes[2..10].try_into().unwrap()) as usize,
                10,
            ),
            n => (n as usize, 2),
        };
        out.push((opcode, fin, bytes[at..at + len].to_vec()));
        bytes = &bytes[at + len..];
    }
    out
}

/// Data messages (opcode, payload) and control frames, as the agent's client assembles them;
/// checks the fragments' opcodes.
fn messages(bytes: &[u8]) -> Vec<(u8, Vec<u8>)> {
    let mut out = Vec::new();
    let mut open: Option<(u8, Vec<u8>)> = None;
    for (opcode, fin, payload) in frames(bytes) {
        if opcode >= 0x8 {
            out.push((opcode, payload));
            continue;
        }
        match (&mut open, opcode) {
            (None, 0x1 | 0x2) => open = Some((opcode, payload)),
            (Some((_, body)), 0x0) => body.extend_from_slice(&payload),
            _ => panic!("fragment opcode {opcode:#x} out of place"),
        }
        if fin {
            out.push(open.take().unwrap());
        }
    }
    assert!(open.is_none(), "a message left unfinished");
    out
}

/// `input` fed in pieces cut at `cuts`.
fn feed_cut(scrubber: &mut FrameScrubber, input: &[u8], cuts: &[usize]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut from = 0;
    for &cut in cuts.iter().chain([input.len()].iter()) {
        scrubber.feed(&input[from..cut], &mut out).unwrap();
        from = cut;
    }
    out
}

fn upstream_stream() -> Vec<u8> {
    let text = format!("{{\"headers\":{{\"authorization\":\"Bearer {SECRET}\"}}}}");
    let (a, b) = text.as_bytes().split_at(40);
    [
        frame(true, 0x1, b"hello"),
        frame(false, 0x1, a),
        frame(true, 0x9, b"ping"),
        frame(true, 0x0, b),
        frame(true, 0x2, &vec![7u8; 70_000]),
        frame(true, 0x1, b""),
        frame(true, 0x8, &[0x03, 0xe8, b'b', b'y', b'e']),
    ]
    .concat()
}

#[test]
fn frames_pass_as_they_came_while_no_secret_is_known() {
    let input = upstream_stream();
    for cuts in [
        vec![],
        vec![1],
        vec![3, 50, 51, 200],
        (1..input.len()).step_by(997).collect(),
    ] {
        let out = feed_cut(&mut knowing(&[]), &input, &cuts);
        assert_eq!(out, input, "cut at {cuts:?}");
    }
}

#[test]
fn a_secret_is_redacted_from_messages_however_the_frames_and_reads_are_cut() {
    let input = upstream_stream();
    let scrubber = Scrubber::new([SECRET]);
    let expected: Vec<(u8, Vec<u8>)> = messages(&input)
        .into_iter()
        .map(|(op, body)| (op, scrubber.scrub_bytes(&body).into_owned()))
        .collect();
    assert!(String::from_utf8_lossy(&expected[2].1).contains(super::super::REDACTED));
    let every: Vec<usize> = (1..input.len()).collect();
    for cuts in [vec![], vec![1], vec![2, 3, 60, 61, 62], every] {
        let out = feed_cut(&mut knowing(&[SECRET]), &input, &cuts);
        assert_eq!(messages(&out), expected, "cut at {} places", cuts.len());
        assert!(
            !out.windows(SECRET.len()).any(|w| w == SECRET.as_bytes()),
            "the secret left"
        );
    }
}

#[test]
fn control_payloads_are_scrubbed_within_their_bound() {
    let mut scrubber = knowing(&[SECRET]);
    let mut out = Vec::new();
    let reason = format!("  {SECRET}");
    let mut close = vec![0x03, 0xe8];
    close.extend_from_slice(reason.as_bytes());
    scrubber
        .feed(&frame(true, 0x9, SECRET.as_bytes()), &mut out)
        .unwrap();
    scrubber.feed(&frame(true, 0x8, &close), &mut out).unwrap();
    let got = frames(&out);
    assert_eq!(got[0].0, 0x9);
    assert_eq!(got[0].2, super::super::REDACTED.as_bytes());
    assert_eq!(got[1].0, 0x8);
    assert!(got[1].2.starts_with(&[0x03, 0xe8]));
    assert!(!String::from_utf8_lossy(&got[1].2).contains(SECRET));
    // Redaction that lengthens a payload past 125 bytes: the ping is cut, a close keeps its
    // code alone.
    let short: &'static [&'static str] = &["k3y"];
    let mut scrubber = knowing(short);
    let mut out = Vec::new();
    let mut close = vec![0x03, 0xe8];
    close.extend_from_slice("k3y".repeat(40).as_bytes());
    scrubber
        .feed(&frame(true, 0x9, "k3y".repeat(41).as_bytes()), &mut out)
        .unwrap();
    scrubber.feed(&frame(true, 0x8, &close), &mut out).unwrap();
    let got = frames(&out);
    assert_eq!(got[0].2.len(), 125);
    assert_eq!(got[1].2, [0x03, 0xe8]);
}

#[test]
fn frames_no_server_may_send_end_the_relay() {
    let masked = {
        let mut f = frame(true, 0x1, b"abcd");
        f[1] |= 0x80;
        f
    };
    let mut reserved = frame(true, 0x1, b"x");
    reserved[0] |= 0x40;
    for (input, error) in [
        (masked, FrameError::Masked),
        (reserved, FrameError::Reserved),
        (frame(true, 0x3, b""), FrameError::Opcode(0x3)),
        (frame(true, 0xb, b""), FrameError::Opcode(0xb)),
        (frame(false, 0x9, b""), FrameError::Control),
        (frame(true, 0x9, &[0; 126]), FrameError::Control),
        (frame(true, 0x0, b"x"), FrameError::Sequence),
        (
            [frame(false, 0x1, b"a"), frame(true, 0x2, b"b")].concat(),
            FrameError::Sequence,
        ),
    ] {
        for secrets in [&[][..], &[SECRET][..]] {
            let secrets: &'static [&'static str] = if secrets.is_empty() { &[] } else { &[SECRET] };
            let mut out = Vec::new();
            assert_eq!(knowing(secrets).feed(&input, &mut out), Err(error.clone()));
        }
    }
}
