//! .npy read/write round trips and the errors for unsupported files.

use expect_test::expect;
use ipu_graph::{DType, Shape, TensorType};
use ipu_reference::{npy, Tensor};

#[test]
fn round_trip_every_dtype() {
    for dtype in [DType::F32, DType::F16, DType::Fp8 { scale_log2: -2 }] {
        let ty = TensorType::new(dtype, vec![3, 5]);
        let t = ipu_reference::random::generate(
            &ty,
            ipu_reference::random::Fill::Gaussian {
                mean: 0.0,
                std: 2.0,
            },
            7,
        );
        let bytes = npy::write(&t);
        assert_eq!(&bytes[..8], b"\x93NUMPY\x01\x00");
        let header_end = 10 + u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
        assert_eq!(header_end % 64, 0, "data is 64-byte aligned");
        assert_eq!(bytes[header_end - 1], b'\n');
        let back = npy::parse(&bytes).unwrap().to_tensor(&ty).unwrap();
        assert_eq!(back, t, "{dtype}");
    }
}

#[test]
fn header_text_is_numpy_style() {
    let t = Tensor::new(DType::F16, Shape::new([4]), vec![1.0, 2.0, 3.0, 4.0]).unwrap();
    let bytes = npy::write(&t);
    let header = std::str::from_utf8(&bytes[10..64]).unwrap().trim_end();
    expect!["{'descr': '<f2', 'fortran_order': False, 'shape': (4,)"].assert_eq(header);
}

fn file(version: (u8, u8), dict: &str, data: &[u8]) -> Vec<u8> {
    let mut out = b"\x93NUMPY".to_vec();
    out.extend([version.0, version.1]);
    if version.0 == 1 {
        out.extend((dict.len() as u16).to_le_bytes());
    } else {
        out.extend((dict.len() as u32).to_le_bytes());
    }
    out.extend(dict.as_bytes());
    out.extend(data);
    out
}

#[test]
fn reads_version_2_f64_and_scalars() {
    let data: Vec<u8> = [1.5f64, -2.25]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    let bytes = file(
        (2, 0),
        "{'descr': '<f8', 'fortran_order': False, 'shape': (1, 2), }\n",
        &data,
    );
    let a = npy::parse(&bytes).unwrap();
    assert_eq!(a.shape, Shape::new([1, 2]));
    let t = a
        .to_tensor(&TensorType::new(DType::F32, vec![1, 2]))
        .unwrap();
    assert_eq!(t.data(), &[1.5, -2.25]);
    let scalar = file(
        (1, 0),
        "{'descr': '<f4', 'fortran_order': False, 'shape': (), }\n",
        &2.0f32.to_le_bytes(),
    );
    assert_eq!(npy::parse(&scalar).unwrap().shape, Shape::new([]));
}

#[test]
fn unsupported_files_are_refused_clearly() {
    let f4 = 1.0f32.to_le_bytes();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("bad magic", b"PK\x03\x04 not numpy".to_vec()),
        ("short", b"\x93NUM".to_vec()),
        ("version", file((4, 0), "{}", &[])),
        (
            "header truncated",
            b"\x93NUMPY\x01\x00\xff\x00{'descr'".to_vec(),
        ),
        (
            "big endian",
            file(
                (1, 0),
                "{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }",
                &f4,
            ),
        ),
        (
            "int",
            file(
                (1, 0),
                "{'descr': '<i4', 'fortran_order': False, 'shape': (1,), }",
                &f4,
            ),
        ),
        (
            "fortran",
            file(
                (1, 0),
                "{'descr': '<f4', 'fortran_order': True, 'shape': (1,), }",
                &f4,
            ),
        ),
        (
            "data length",
            file(
                (1, 0),
                "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }",
                &f4,
            ),
        ),
        (
            "structured",
            file(
                (1, 0),
                "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,), }",
                &f4,
            ),
        ),
        (
            "no shape",
            file((1, 0), "{'descr': '<f4', 'fortran_order': False}", &f4),
        ),
    ];
    let messages: Vec<String> = cases
        .iter()
        .map(|(name, bytes)| format!("{name}: {}", npy::parse(bytes).unwrap_err()))
        .collect();
    expect![[r#"
        [
            "bad magic: not a .npy file (the magic string \\x93NUMPY is missing)",
            "short: truncated .npy header: needs 10 bytes, the file has 4",
            "version: unsupported .npy format version 4.0 (supported: 1.0, 2.0, 3.0)",
            "header truncated: truncated .npy header: needs 265 bytes, the file has 18",
            "big endian: unsupported .npy dtype '>f4' (supported: '<f2', '<f4', '<f8', '|u1'; data must be little-endian)",
            "int: unsupported .npy dtype '<i4' (supported: '<f2', '<f4', '<f8', '|u1'; data must be little-endian)",
            "fortran: Fortran-order .npy data is not supported; save a C-order array",
            "data length: .npy data has 4 bytes but the header's shape needs 8",
            "structured: unreadable .npy header: 'descr' is not a string (structured dtypes are not supported) in \"{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,), }\"",
            "no shape: unreadable .npy header: no 'shape' key in \"{'descr': '<f4', 'fortran_order': False}\"",
        ]
    "#]]
    .assert_debug_eq(&messages);
}

#[test]
fn conversions_check_the_type() {
    let t = Tensor::new(DType::F16, Shape::new([2]), vec![1.0, 2.0]).unwrap();
    let a = npy::parse(&npy::write(&t)).unwrap();
    let errors = [
        a.to_tensor(&TensorType::new(DType::F16, vec![1, 2]))
            .unwrap_err()
            .to_string(),
        a.to_tensor(&TensorType::new(DType::Fp8 { scale_log2: 0 }, vec![2]))
            .unwrap_err()
            .to_string(),
    ];
    expect![[r#"
        [
            ".npy shape [2] differs from the expected type f16[1, 2]",
            ".npy dtype '<f2' cannot hold fp8[2] (fp8 tensors are stored as '|u1' codes and only they are)",
        ]
    "#]]
    .assert_debug_eq(&errors);
}
