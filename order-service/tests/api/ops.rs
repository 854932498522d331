//! The operator endpoints of order-service.

#[tokio::test]
async fn readyz_reports_ready_and_names_the_service() {
    let app = crate::helpers::spawn_app().await;
    let client = reqwest::Client::new();
    let url = format!("{}/readyz", app.address);
    // Ready once the consumer holds its channel; the report says whose it is, so a prober
    // can tell this service from another holding the same port.
    let report = seckill_testkit::eventually(
        "order-service ready",
        std::time::Duration::from_secs(10),
        || async {
            let response = client.get(&url).send().await.ok()?;
            if response.status() != 200 {
                return None;
            }
            response.json::<serde_json::Value>().await.ok()
        },
    )
    .await;
    assert_eq!(report["service"], "order-service", "{report}");
    assert_eq!(report["ready"], true, "{report}");
    app.shutdown().await;
}
