//! The API crate's errors print their cause once (the workspace rule in `flex_host::error`):
//! in the message, never again as a `source()`. Real causes: serde's, the reference parser's.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

use flex_api::arm::parse_arm_machine;
use flex_api::image::ImageRef;
use flex_api::operations::decide::validate_image;
use flex_testkit::assert_cause_once;

#[test]
fn api_errors_print_their_cause_once() {
    let arm =
        parse_arm_machine(br#"{"properties": {"kubernetes": {"maxPods": "x"}}}"#).unwrap_err();
    let serde = arm.cause.to_string();
    assert_cause_once(&arm, &serde);

    let bad = "Not A Reference!";
    let reason = ImageRef::parse(bad).unwrap_err().to_string();
    let image = validate_image(bad).unwrap_err();
    assert_cause_once(&image, &reason);
}
