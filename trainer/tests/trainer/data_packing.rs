//! Packing: row lengths, EOS at document boundaries, every token exactly once per epoch.

use hlat_train::data::tokens::append_document;
use hlat_train::data::{PackedRows, RowSource, Sampler, inputs_and_targets};

const EOS: u32 = 0;

/// Documents of lengths 1..=40 (cycling) whose tokens are all distinct and non-zero.
fn documents(count: usize) -> Vec<Vec<u32>> {
    let mut next = 1;
    (0..count)
        .map(|i| {
            let length = 1 + (i * 17) % 40;
            let document: Vec<u32> = (next..next + length as u32).collect();
            next += length as u32;
            document
        })
        .collect()
}

fn stream(documents: &[Vec<u32>]) -> Vec<u32> {
    let mut stream = Vec::new();
    for document in documents {
        append_document(&mut stream, document, EOS);
    }
    stream
}

#[test]
fn rows_have_seq_len_plus_one_tokens_and_eos_ends_every_document() {
    let documents = documents(100);
    let total: usize = documents.iter().map(|d| d.len() + 1).sum();
    let seq_len = 31;
    let rows = PackedRows::new(stream(&documents), seq_len).unwrap();
    assert_eq!(rows.row_len(), 32);
    assert_eq!(rows.num_rows(), total / 32);
    assert_eq!(rows.dropped_tail_tokens(), total % 32);
    let packed: Vec<u32> = (0..rows.num_rows()).flat_map(|i| rows.row(i)).collect();
    for i in 0..rows.num_rows() {
        let row = rows.row(i);
        assert_eq!(row.len(), seq_len + 1);
        let (inputs, targets) = inputs_and_targets(&row);
        assert_eq!((inputs.len(), targets.len()), (seq_len, seq_len));
        assert_eq!(inputs[1..], targets[..seq_len - 1]);
    }
    // The EOS positions are exactly the ends of the documents, in order.
    let mut boundary = 0;
    let mut expected_eos = Vec::new();
    for document in &documents {
        boundary += document.len();
        expected_eos.push(boundary);
        boundary += 1;
    }
    let eos_positions: Vec<usize> = (0..packed.len()).filter(|&i| packed[i] == EOS).collect();
    let kept: Vec<usize> = expected_eos
        .into_iter()
        .filter(|&position| position < packed.len())
        .collect();
    assert_eq!(eos_positions, kept);
}

#[test]
fn an_epoch_sees_every_packed_token_exactly_once() {
    let documents = documents(300);
    let stream = stream(&documents);
    let rows = PackedRows::new(stream.clone(), 63).unwrap();
    let (num_rows, row_len, tail) = (rows.num_rows(), rows.row_len(), rows.dropped_tail_tokens());
    let mut sampler = Sampler::new(rows, 7).unwrap();
    let mut seen: Vec<u32> = Vec::new();
    let mut batches = 0;
    while sampler.state().epoch == 0 && seen.len() < num_rows * row_len {
        for row in sampler.next_batch(1) {
            seen.extend(row);
        }
        batches += 1;
    }
    assert_eq!(batches, num_rows);
    // No document token is lost or duplicated: each appears once, apart from the dropped tail.
    let mut document_tokens: Vec<u32> = seen.iter().copied().filter(|&t| t != EOS).collect();
    document_tokens.sort_unstable();
    let expected: Vec<u32> = stream[..stream.len() - tail]
        .iter()
        .copied()
        .filter(|&t| t != EOS)
        .collect();
    let mut sorted_expected = expected.clone();
    sorted_expected.sort_unstable();
    assert_eq!(document_tokens, sorted_expected);
    let eos_count = seen.iter().filter(|&&t| t == EOS).count();
    assert_eq!(
        eos_count,
        stream[..stream.len() - tail]
            .iter()
            .filter(|&&t| t == EOS)
            .count()
    );
    assert!(
        stream[stream.len() - tail..]
            .iter()
            .all(|t| *t == EOS || !seen.contains(t)),
        "the dropped tail is not used"
    );
}

#[test]
fn too_few_tokens_for_one_row_is_an_error() {
    let error = PackedRows::new(vec![1, 2, 3], 3).err().unwrap().to_string();
    assert!(
        error.contains("3 tokens") && error.contains("one row of 4"),
        "{error}"
    );
    assert!(PackedRows::new(vec![1, 2, 3], 0).is_err());
}
