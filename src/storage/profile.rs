//! Settings of an AWS named profile from the shared files that `object_store` does not read
//! (docs/STORAGE.md): the profile is `AWS_PROFILE` (else `default`); `~/.aws/credentials`
//! (`AWS_SHARED_CREDENTIALS_FILE`) section `[NAME]` gives `aws_access_key_id`,
//! `aws_secret_access_key`, `aws_session_token`; `~/.aws/config` (`AWS_CONFIG_FILE`) section
//! `[profile NAME]` (`[default]`) gives `region`, `endpoint_url` and, when the credentials file
//! has none, the keys. The environment variables win over both files, as for the AWS CLI.

use std::path::PathBuf;

use ini::Ini;

use crate::error::{Error, Result};

/// What a profile sets (each `None` when neither file sets it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Profile {
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
    pub session_token: Option<String>,
    pub region: Option<String>,
    pub endpoint_url: Option<String>,
}

fn file(var: &str, default: &str) -> Option<PathBuf> {
    match std::env::var_os(var) {
        Some(path) => Some(PathBuf::from(path)),
        None => std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".aws").join(default)),
    }
}

/// Section `section` of the INI file `path`: `Ok(None)` when the file or the section is absent.
fn section(path: &Option<PathBuf>, section: &str) -> Result<Option<ini::Properties>> {
    let Some(path) = path.as_ref().filter(|p| p.is_file()) else {
        return Ok(None);
    };
    let ini = Ini::load_from_file(path).map_err(|e| Error::Storage {
        url: path.display().to_string(),
        status: None,
        message: format!("cannot read this AWS shared configuration file ({e})"),
    })?;
    Ok(ini.section(Some(section)).cloned())
}

/// The profile named by `AWS_PROFILE` (else `default`). A profile named by `AWS_PROFILE` that
/// neither file holds is an error naming both files; a missing `default` is no error.
pub fn load() -> Result<Profile> {
    let named = std::env::var("AWS_PROFILE").ok().filter(|p| !p.is_empty());
    let name = named.clone().unwrap_or_else(|| "default".to_owned());
    let credentials_file = file("AWS_SHARED_CREDENTIALS_FILE", "credentials");
    let config_file = file("AWS_CONFIG_FILE", "config");
    let credentials = section(&credentials_file, &name)?;
    let config_section = if name == "default" {
        name.clone()
    } else {
        format!("profile {name}")
    };
    let config = section(&config_file, &config_section)?;
    if credentials.is_none() && config.is_none() && named.is_some() {
        let shown = |p: &Option<PathBuf>| p.as_ref().map_or("(no HOME)".to_owned(), |p| p.display().to_string());
        return Err(Error::Storage {
            url: shown(&credentials_file),
            status: None,
            message: format!(
                "AWS_PROFILE={name}: no [{name}] section in this credentials file nor [{config_section}] in {}",
                shown(&config_file)
            ),
        });
    }
    let get = |key: &str| {
        credentials
            .as_ref()
            .and_then(|s| s.get(key))
            .or_else(|| config.as_ref().and_then(|s| s.get(key)))
            .map(str::to_owned)
    };
    Ok(Profile {
        access_key_id: get("aws_access_key_id"),
        secret_access_key: get("aws_secret_access_key"),
        session_token: get("aws_session_token"),
        region: config.as_ref().and_then(|s| s.get("region")).map(str::to_owned),
        endpoint_url: config.as_ref().and_then(|s| s.get("endpoint_url")).map(str::to_owned),
    })
}
