//! `nightmail client-config mutt|neomutt|aerc|thunderbird [--user NAME]`: a working configuration
//! for one local account in that client's own format, printed to standard output. It is read from
//! the daemon's configuration, so the ports, the TLS choice and the address are the ones the
//! daemon serves. No password is printed: the client asks for it (or, for aerc, runs the command
//! the comment names).

use std::net::SocketAddr;

use anyhow::{Context, bail};
use clap::ValueEnum;
use nightmail_config::{Config, TlsConfig, User};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Client {
    Mutt,
    Neomutt,
    Aerc,
    Thunderbird,
}

/// How a client reaches one listener: a host it can connect to, the port, and whether it must
/// STARTTLS (the daemon offers it when `[tls]` is set; without it only loopback allows a login).
struct Endpoint {
    host: String,
    port: u16,
    starttls: bool,
}

impl Endpoint {
    fn of(listen: SocketAddr, config: &Config) -> Endpoint {
        // A wildcard listener is reached on loopback from this machine.
        let host = if listen.ip().is_unspecified() { "127.0.0.1".to_string() } else { listen.ip().to_string() };
        Endpoint { host, port: listen.port(), starttls: config.tls.is_some() }
    }
}

/// The configuration text for `client`, for `user` (default: the only user, else the first).
pub fn render(config: &Config, client: Client, user: Option<&str>) -> anyhow::Result<String> {
    let user = pick_user(config, user)?;
    for (key, listen) in [("smtp.listen", config.smtp.listen), ("imap.listen", config.imap.listen)] {
        if listen.port() == 0 {
            bail!("{key} = {listen} lets the system pick a port each start: a client needs a fixed one");
        }
    }
    let imap = Endpoint::of(config.imap.listen, config);
    let smtp = Endpoint::of(config.smtp.listen, config);
    let ca = match &config.tls {
        Some(TlsConfig::Files { cert, .. }) => Some(cert.clone()),
        Some(TlsConfig::SelfSigned) => Some(config.data_dir.join("tls").join("cert.pem")),
        None => None,
    };
    let ca = ca.map(|p| std::fs::canonicalize(&p).unwrap_or(p).display().to_string());
    Ok(match client {
        Client::Mutt | Client::Neomutt => muttrc(user, &imap, &smtp, ca.as_deref(), client),
        Client::Aerc => aerc(user, &imap, &smtp),
        Client::Thunderbird => thunderbird(config, user, &imap, &smtp),
    })
}

fn pick_user<'a>(config: &'a Config, name: Option<&str>) -> anyhow::Result<&'a User> {
    match name {
        Some(name) => config.user(name).with_context(|| {
            let known: Vec<&str> = config.users.iter().map(|u| u.name.as_str()).collect();
            format!("no user `{name}` in the configuration (users: {})", known.join(", "))
        }),
        None => match config.users.first() {
            Some(user) => Ok(user),
            None => {
                bail!("the configuration has no [[user]]: add one with `nightmail user add NAME --address ADDRESS`")
            }
        },
    }
}

/// mutt and neomutt read the same variables. Every setting that would otherwise prompt is set:
/// `folder` (else mutt offers to create ~/Mail), the TLS choice (mutt 2's `ssl_force_tls` default
/// and a STARTTLS offer would otherwise ask about certificates).
fn muttrc(user: &User, imap: &Endpoint, smtp: &Endpoint, ca: Option<&str>, client: Client) -> String {
    let name = &user.name;
    let tls = if imap.starttls {
        let mut lines = "set ssl_starttls=yes\nset ssl_force_tls=yes\n".to_string();
        if let Some(ca) = ca {
            lines.push_str(&format!("set ssl_ca_certificates_file=\"{ca}\"\n"));
        }
        lines
    } else {
        "# Plain text on loopback: nothing crosses the network.\nset ssl_starttls=no\nset ssl_force_tls=no\n"
            .to_string()
    };
    let which = if client == Client::Neomutt { "neomutt" } else { "mutt" };
    format!(
        "# {which} for {address} on nightmail: {which} -F THIS_FILE\n\
         set from=\"{address}\"\n\
         set folder=\"imap://{name}@{ih}:{ip}/\"\n\
         set spoolfile=\"+INBOX\"\n\
         set record=\"+Sent\"\n\
         set postponed=\"+Drafts\"\n\
         set smtp_url=\"smtp://{name}@{sh}:{sp}/\"\n\
         {tls}\
         set imap_idle=yes\n\
         set mail_check=60\n\
         set sort=threads\n\
         set sort_aux=last-date-received\n\
         # Models write Markdown: shown as text; the HTML alternative is for web and phone clients.\n\
         alternative_order text/plain text/html\n",
        address = user.address,
        ih = imap.host,
        ip = imap.port,
        sh = smtp.host,
        sp = smtp.port,
    )
}

/// An `accounts.conf` section (aerc-accounts(5), aerc-imap(5), aerc-smtp(5)).
fn aerc(user: &User, imap: &Endpoint, smtp: &Endpoint) -> String {
    let (imap_scheme, smtp_scheme) = if imap.starttls { ("imap", "smtp") } else { ("imap+insecure", "smtp+insecure") };
    let login = user.name.replace('@', "%40");
    format!(
        "# aerc: add to ~/.config/aerc/accounts.conf (kept mode 600); the password comes from the\n\
         # command below: store it with e.g. `pass insert nightmail/{name}`.\n\
         [nightmail-{name}]\n\
         source = {imap_scheme}://{login}@{ih}:{ip}\n\
         source-cred-cmd = pass nightmail/{name}\n\
         outgoing = {smtp_scheme}://{login}@{sh}:{sp}\n\
         outgoing-cred-cmd = pass nightmail/{name}\n\
         from = {address}\n\
         copy-to = Sent\n",
        name = user.name,
        address = user.address,
        ih = imap.host,
        ip = imap.port,
        sh = smtp.host,
        sp = smtp.port,
    )
}

/// Mozilla's autoconfig format (clientConfig 1.1, as Thunderbird's ISPDB serves it): saved as
/// `isp/DOMAIN.xml` in Thunderbird's installation directory, the account wizard fills itself in.
fn thunderbird(config: &Config, user: &User, imap: &Endpoint, smtp: &Endpoint) -> String {
    let socket = |e: &Endpoint| if e.starttls { "STARTTLS" } else { "plain" };
    let domain = user.address.domain();
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n\
         <!-- Thunderbird: save as isp/{domain}.xml in Thunderbird's installation directory, then add\n\
              the account {address}: the wizard fills in the servers below. -->\n\
         <clientConfig version=\"1.1\">\n\
         \x20 <emailProvider id=\"{domain}\">\n\
         \x20   <domain>{domain}</domain>\n\
         \x20   <displayName>nightmail on {hostname}</displayName>\n\
         \x20   <incomingServer type=\"imap\">\n\
         \x20     <hostname>{ih}</hostname>\n\
         \x20     <port>{ip}</port>\n\
         \x20     <socketType>{isock}</socketType>\n\
         \x20     <username>{name}</username>\n\
         \x20     <authentication>password-cleartext</authentication>\n\
         \x20   </incomingServer>\n\
         \x20   <outgoingServer type=\"smtp\">\n\
         \x20     <hostname>{sh}</hostname>\n\
         \x20     <port>{sp}</port>\n\
         \x20     <socketType>{ssock}</socketType>\n\
         \x20     <username>{name}</username>\n\
         \x20     <authentication>password-cleartext</authentication>\n\
         \x20   </outgoingServer>\n\
         \x20 </emailProvider>\n\
         </clientConfig>\n",
        address = user.address,
        hostname = xml_text(&config.hostname),
        name = xml_text(&user.name),
        ih = imap.host,
        ip = imap.port,
        isock = socket(imap),
        sh = smtp.host,
        sp = smtp.port,
        ssock = socket(smtp),
    )
}

fn xml_text(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(extra: &str) -> Config {
        Config::parse(
            &format!(
                "hostname = \"n.test\"\n{extra}\n[smtp]\nlisten = \"127.0.0.1:2525\"\n[imap]\nlisten = \"0.0.0.0:1143\"\n\
                 [[user]]\nname = \"me\"\naddress = \"me@n.test\"\npassword = \"x\"\n\
                 [[user]]\nname = \"ann\"\naddress = \"ann@n.test\"\npassword = \"x\"\n"
            ),
            None,
        )
        .unwrap()
    }

    #[test]
    fn mutt_gets_the_daemons_ports_and_no_tls_on_plain_loopback() {
        let text = render(&config(""), Client::Mutt, None).unwrap();
        assert!(text.contains("set folder=\"imap://me@127.0.0.1:1143/\"\n"), "{text}");
        assert!(text.contains("set smtp_url=\"smtp://me@127.0.0.1:2525/\"\n"), "{text}");
        assert!(text.contains("set ssl_starttls=no\nset ssl_force_tls=no\n"), "{text}");
        let ann = render(&config(""), Client::Neomutt, Some("ann")).unwrap();
        assert!(ann.starts_with("# neomutt for ann@n.test") && ann.contains("imap://ann@"), "{ann}");
    }

    #[test]
    fn with_tls_every_client_uses_starttls() {
        let c = config("[tls]\nself_signed = true\n");
        assert!(render(&c, Client::Mutt, None).unwrap().contains("set ssl_starttls=yes\nset ssl_force_tls=yes\n"));
        let aerc = render(&c, Client::Aerc, None).unwrap();
        assert!(aerc.contains("source = imap://me@127.0.0.1:1143\n"), "{aerc}");
        let tb = render(&c, Client::Thunderbird, None).unwrap();
        assert_eq!(tb.matches("<socketType>STARTTLS</socketType>").count(), 2, "{tb}");
        let plain = render(&config(""), Client::Aerc, None).unwrap();
        assert!(plain.contains("outgoing = smtp+insecure://me@127.0.0.1:2525\n"), "{plain}");
    }

    #[test]
    fn a_port_chosen_at_each_start_is_refused() {
        let c = Config::parse(
            "[smtp]\nlisten = \"127.0.0.1:0\"\n[[user]]\nname = \"me\"\naddress = \"me@n.test\"\npassword = \"x\"\n",
            None,
        )
        .unwrap();
        let e = render(&c, Client::Mutt, None).unwrap_err().to_string();
        assert_eq!(e, "smtp.listen = 127.0.0.1:0 lets the system pick a port each start: a client needs a fixed one");
    }

    #[test]
    fn an_unknown_user_is_named_with_the_known_ones() {
        let e = render(&config(""), Client::Mutt, Some("bob")).unwrap_err().to_string();
        assert_eq!(e, "no user `bob` in the configuration (users: me, ann)");
    }
}
