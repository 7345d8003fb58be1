//! Operator commands: status, list, break, doctor.
pub mod breaking;
pub mod doctor;
pub mod list;
pub mod status;
