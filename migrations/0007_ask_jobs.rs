//! Schema 7: a job records how its question came (`Job::origin`): mail to the model, or a message
//! the user filed into an `Ask/<model>` folder. Jobs written before have no such field and read
//! as mail, which is what they were; nothing is rewritten.
//!
//! The step exists for the version number: a build before schema 7 would read an Ask job as mail
//! and send its answer to everyone in the asked-about thread, not to the user who asked
//! privately. Recording 7 makes such a build refuse the store (`StoreError::TooNew`) instead.

use crate::StoreError;

pub fn apply(_db: &sled::Db) -> Result<(), StoreError> {
    Ok(())
}
